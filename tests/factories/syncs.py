"""A log of the calls that make files durable, in the order a test's code makes them: to
check that data is fsynced before the name that announces it, and its folder after."""

from __future__ import annotations

import os

import pytest


def logged_syncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """``("fsync", path)``, ``("replace", final path)`` and ``("rename", source, target)``
    as they happen (the real calls still run)."""
    log: list[tuple[str, ...]] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        real_fsync(fd)
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        real_replace(source, target)
        log.append(("replace", str(target)))

    def rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        real_rename(source, target)
        log.append(("rename", str(source), str(target)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return log
