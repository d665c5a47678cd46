"""GDCM loaded only when a study needs it; requests and tqdm not at all.

pydicom imports every installed pixel-data plugin the first time it is imported, and
GDCM's costs ~20 MiB of resident memory (its DICOM dictionary and libraries) in every
radserve process: the server, its decoding and receiving processes. Most studies never
need it (native data is read by pydicom itself, JPEG 2000 by pylibjpeg). pydicom also
imports requests and tqdm (~7 MiB, ~0.5 s) for downloading its own test files, which
radserve never does (pydicom falls back to urllib without them). So when ``radserve``
is imported before pydicom, pydicom's own first import runs with these hidden: its GDCM
plugins register as unavailable. :func:`enable_gdcm` puts them back, first in each
coder's plugin table as pydicom registers them, before the first decode that may use
GDCM (``radserve.ingest.decode`` calls it). Imports nothing of radserve.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

_GDCM_MODULES = ("pydicom.pixels.decoders.gdcm", "pydicom.pixels.encoders.gdcm")
_lock = threading.Lock()
_deferred = False


class _HideDuringPydicomImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the ``pydicom`` package so that its
    first import sees none of ``hidden``, then removes itself."""

    def __init__(self, hidden: tuple[str, ...]) -> None:
        self.hidden = hidden

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pydicom":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        hidden = self.hidden

        def exec_hiding(module: ModuleType) -> None:
            global _deferred
            for name in hidden:
                sys.modules[name] = None  # type: ignore[assignment]  # import -> ImportError
            try:
                exec_module(module)
            finally:
                for name in hidden:
                    sys.modules.pop(name, None)
            if "gdcm" in hidden:
                for name in _GDCM_MODULES:  # imported again, with gdcm, by enable_gdcm
                    sys.modules.pop(name, None)
                _deferred = True

        loader.exec_module = exec_hiding  # type: ignore[method-assign]
        return spec


def defer_gdcm() -> None:
    """Hide GDCM, requests and tqdm (those installed and not yet imported) from
    pydicom's first import, if it has not happened yet (``import radserve`` calls this)."""
    if "pydicom" in sys.modules:
        return
    if any(isinstance(f, _HideDuringPydicomImport) for f in sys.meta_path):
        return
    hidden = tuple(
        name
        for name in ("gdcm", "requests", "tqdm")
        if name not in sys.modules and importlib.util.find_spec(name) is not None
    )
    if hidden:
        sys.meta_path.insert(0, _HideDuringPydicomImport(hidden))


def enable_gdcm_for(transfer_syntax_uid: str) -> None:
    """:func:`enable_gdcm` if GDCM is one of pydicom's decoders for this syntax."""
    if not _deferred:
        return
    from pydicom.pixels.decoders.base import _PIXEL_DATA_DECODERS

    entry = _PIXEL_DATA_DECODERS.get(transfer_syntax_uid)
    if entry is not None and "gdcm" in entry[0]._unavailable:
        enable_gdcm()


def enable_gdcm() -> None:
    """Register pydicom's GDCM plugins that :func:`defer_gdcm` kept out, first among each
    coder's plugins as pydicom registers them. Cheap once done; thread-safe."""
    global _deferred
    if not _deferred:
        return
    with _lock:
        if not _deferred:
            return
        from pydicom.pixels.decoders.base import _PIXEL_DATA_DECODERS
        from pydicom.pixels.encoders.base import _PIXEL_DATA_ENCODERS

        for decoder, _ in _PIXEL_DATA_DECODERS.values():
            _put_first(decoder, ("pydicom.pixels.decoders.gdcm", "_decode_frame"))
        for encoder, _ in _PIXEL_DATA_ENCODERS.values():
            _put_first(encoder, ("pydicom.pixels.encoders.gdcm", "encode_pixel_data"))
        _deferred = False


def _put_first(coder: Any, import_path: tuple[str, str]) -> None:
    """GDCM's plugin back in a coder that lists it as unavailable, first, where pydicom
    registers it (tests/unit/test_pydicom_plugins.py checks the order against a process
    that imported pydicom plainly). What ``Coder.add_plugin`` does, but the plugin table
    is replaced in one assignment, so a decode on another thread never sees it half
    rebuilt."""
    if "gdcm" not in coder._unavailable:
        return
    module = importlib.import_module(import_path[0])
    if not module.is_available(coder.UID):
        return
    coder._available = {"gdcm": getattr(module, import_path[1]), **coder._available}
    del coder._unavailable["gdcm"]
