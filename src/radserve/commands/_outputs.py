"""Output folders of the commands that write a whole set of files (``radserve run``,
``radserve phantom``): refused when they already hold files, written whole or not at all.

Before 2026-12-08 ``run --out`` wrote straight into the folder: a second run into it left
the first run's files beside its own (``--no-dicom`` kept another study's SEG and SR, a
study with fewer findings kept the other's key images), and a run stopped with Ctrl-C
after its report left ``report.json`` and the label maps without the SEG/SR, a folder
that looked finished. ``phantom`` into an existing folder left the earlier phantom's
slices beside the new ones (``--slices 5`` after a 40-slice phantom: 40 slices in the
series, 5 in the ground truth), and ``--out`` under a file was a traceback.

Now the results are written into a staging folder inside the output folder (an owned
temporary, :func:`radserve.durable.temporary_dir`, swept when its writer is gone) and
moved out only when everything is written, the file that says the set is complete
(``report.json``) last. A failure or an interrupt removes the staging folder (and the
output folder, when this command created it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import click

from radserve.durable import TEMPORARY_SUFFIX, fsync_dir, make_dirs, sweep, temporary_dir

_STAGING_STEM = "radserve-partial"


class Refused(click.ClickException):
    """A refusal of what the command was given: one line, exit status 2 (as click's usage
    errors, and a RadserveError's refusal)."""

    exit_code = 2


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)


def held_names(folder: Path) -> list[str]:
    """What ``folder`` holds besides staging temporaries (its own or another writer's),
    sorted; nothing when it does not exist."""
    try:
        return sorted(name for name in os.listdir(folder) if not _temporary(name))
    except FileNotFoundError:
        return []


def refuse_unusable(folder: Path, option: str) -> None:
    """One line, exit 2, before any work, when ``folder`` cannot take the results: a link
    to nothing, a file, under a file, a place this process may not write, or a folder that
    already holds files (two sets of results would mix)."""
    if folder.is_symlink() and not folder.exists():
        raise Refused(f"{option} {folder} is a link to nothing; give a folder")
    if folder.exists():
        if not folder.is_dir():
            raise Refused(
                f"{option} {folder} is an existing file, not a folder; give a folder to write to"
            )
        where = folder
    else:
        # the nearest existing folder above: where the missing ones would be created
        where = next((p for p in folder.absolute().parents if p.exists()), Path("/"))
        if not where.is_dir():
            raise Refused(
                f"{option} {folder}: {where} is a file, not a folder; give a folder to write to"
            )
    if not os.access(where, os.W_OK | os.X_OK):
        raise Refused(f"{option} {folder}: cannot write in {where} (permission denied)")
    _refuse_held(folder, option)


def _refuse_held(folder: Path, option: str) -> None:
    held = held_names(folder)
    if held:
        shown = ", ".join(held[:3]) + (", ..." if held[3:] else "")
        raise Refused(
            f"{option} {folder} already holds {len(held)} file(s) or folder(s) ({shown}): "
            "the results would mix with them; give a new or empty folder"
        )


@contextlib.contextmanager
def staged(folder: Path, option: str, *, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """A staging folder inside ``folder`` to write the results into; when the block ends
    without an error its entries move into ``folder``, the names in ``last`` after the
    others. On an error or an interrupt nothing is moved: the staging folder is removed,
    and ``folder`` too when this created it (and it is empty)."""
    created = not folder.exists()
    try:
        make_dirs(folder)
    except OSError as exc:
        raise Refused(f"{option} {folder}: cannot create it: {exc.strerror}") from None
    staging: Path | None = None
    try:
        sweep(folder)  # staging folders of runs that were killed (kill -9, a power cut)
        _refuse_held(folder, option)  # checked again: another run may have written since
        staging = temporary_dir(folder, _STAGING_STEM)
        yield staging
        _publish(staging, folder, option, last)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _publish(staging: Path, folder: Path, option: str, last: tuple[str, ...]) -> None:
    """Move the finished results out of ``staging``; ``last`` (the file that says they are
    complete) after the others. Refused, with nothing moved, when another writer put
    results into ``folder`` meanwhile (two runs into one folder at once)."""
    present = sorted(os.listdir(staging))
    names = [n for n in present if n not in last] + [n for n in last if n in present]
    taken = held_names(folder)
    if taken:
        raise click.ClickException(
            f"{option} {folder}: another run wrote {', '.join(taken[:3])} there meanwhile; "
            "this run's results were not kept"
        )
    moved: list[Path] = []
    try:
        for name in names:
            os.rename(staging / name, folder / name)
            moved.append(folder / name)
        fsync_dir(folder)
        staging.rmdir()
    except BaseException:
        for path in moved:  # a half-moved set is no result: take it back out
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        raise


__all__ = ["Refused", "held_names", "refuse_unusable", "staged"]
