"""Package exports imported on first use (PEP 562), for the packages whose names pull in
heavy libraries (nibabel, SciPy, onnxruntime) that not every importer needs. Imports
nothing of radserve, so any package may use it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each name to
    the submodule defining it, imported (and the name cached on the package) when first
    read; ``names`` (its ``__all__``) are listed by ``dir`` before then."""
    listed = set(names)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | listed)

    return __getattr__, __dir__
