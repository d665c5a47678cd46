"""``python -m tests.fuzz.run TARGET [libFuzzer flags] [CORPUS_DIR ...]``: one target
under atheris, the modules of its surface (its ``COVERED`` prefixes) instrumented for
coverage. With a file instead of a folder it runs that one input (a reproducer); a
missing or empty folder gets the target's seed corpus first.
``python -m tests.fuzz.run TARGET --seeds DIR`` writes the target's seed corpus to DIR.

Only the surface's modules are instrumented, after the target is imported: atheris'
``instrument_imports`` over all of radserve and pydicom cost ~30 CPU-s per start (pydicom's
data dictionaries alone), more than a CI run of every target may take."""

from __future__ import annotations

import gc
import hashlib
import sys
import types
from pathlib import Path


def write_seeds(target: str, folder: Path) -> int:
    from tests.fuzz.targets import load

    folder.mkdir(parents=True, exist_ok=True)
    seeds = load(target).seeds()
    for seed in seeds:
        (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    return len(seeds)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    target = argv[1]
    if argv[2:3] == ["--seeds"]:
        print(f"{write_seeds(target, Path(argv[3]))} seeds written")
        return
    import atheris

    from tests.fuzz.targets import load

    module = load(target)
    for folder in _empty_corpus_folders(argv[2:]):  # here, not in a second interpreter
        write_seeds(target, folder)
    instrumented = instrument(atheris, tuple(module.COVERED))
    print(f"INFO: {instrumented} functions of {', '.join(module.COVERED)} instrumented")
    atheris.Setup([argv[0], *argv[2:]], module.one_input)
    atheris.Fuzz()


def _empty_corpus_folders(args: list[str]) -> list[Path]:
    """The corpus folders named in ``args`` (libFuzzer's positional arguments) that are
    missing or empty: they get the target's seed corpus before the run."""
    folders = [Path(a) for a in args if not a.startswith("-")]
    return [f for f in folders if not f.is_file() and not (f.is_dir() and any(f.iterdir()))]


def instrument(atheris: types.ModuleType, prefixes: tuple[str, ...]) -> int:
    """Instrument every loaded function of the modules under ``prefixes``."""
    functions = [
        f
        for f in gc.get_objects()
        if isinstance(f, types.FunctionType) and str(f.__module__).startswith(prefixes)
    ]
    for function in functions:
        atheris.instrument_func(function)
    return len(functions)


if __name__ == "__main__":
    main(sys.argv)
