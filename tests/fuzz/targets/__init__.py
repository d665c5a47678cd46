"""The fuzz targets, one module per hostile-input surface. Each defines

- ``seeds() -> list[bytes]``: the seed corpus, generated (phantom slices, shipped assets,
  the test factories): nothing downloaded, nothing large committed;
- ``one_input(data: bytes) -> None``: one input through what the doors call, raising
  only what :func:`tests.fuzz.invariant.refusals_only` does not declare.

``one_input`` needs no atheris: the regression tests call it on committed reproducers."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

TARGETS = ("instance", "series", "multipart", "settings", "importers", "qido", "nifti")


def load(name: str) -> ModuleType:
    if name not in TARGETS:
        raise SystemExit(f"unknown fuzz target {name!r}; one of {', '.join(TARGETS)}")
    return importlib.import_module(f"{__name__}.{name}")


def entry(name: str) -> Callable[[bytes], None]:
    return load(name).one_input  # type: ignore[no-any-return]


__all__ = ["TARGETS", "entry", "load"]
