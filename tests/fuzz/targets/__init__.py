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
# what a target imports beyond the test extras: the optional PyTorch extras (.ci/run
# installs them); without them its runs and reproducers are skipped with a reason, as the
# import agreement tests are (README), not failed on an import error
NEEDS = {"importers": ("torch", "monai")}


def skip_without_needs(name: str) -> None:
    """Skip the calling test when target ``name`` needs a module not installed here."""
    import pytest

    for module in NEEDS.get(name, ()):
        pytest.importorskip(module, reason=f"the {name} fuzz target needs {module}")


def load(name: str) -> ModuleType:
    if name not in TARGETS:
        raise SystemExit(f"unknown fuzz target {name!r}; one of {', '.join(TARGETS)}")
    return importlib.import_module(f"{__name__}.{name}")


def entry(name: str) -> Callable[[bytes], None]:
    return load(name).one_input  # type: ignore[no-any-return]


__all__ = ["NEEDS", "TARGETS", "entry", "load", "skip_without_needs"]
