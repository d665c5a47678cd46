"""GDCM loaded only when pydicom decodes with it; requests and tqdm not at all.

pydicom imports every installed pixel-data plugin the first time it is imported, and
GDCM's costs ~20 MiB of resident memory (its DICOM dictionary and libraries) in every
radserve process: the server, its decoding and receiving processes. Most studies never
need it (native data is read by pydicom itself, JPEG 2000 by pylibjpeg). pydicom also
imports requests and tqdm (~7 MiB, ~0.5 s) for downloading its own test files, which
radserve never does (pydicom falls back to urllib without them). So when ``radserve``
is imported before pydicom, pydicom's own first import runs with these hidden, and each
coder's GDCM plugin is then put back, in its place (first, as pydicom registers it), as
a stand-in that imports GDCM's real plugin the first time pydicom calls it. pydicom
therefore chooses among the same plugins in the same order as with a plain import,
whoever in the process decodes. Imports nothing of radserve.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_GDCM_MODULES = ("pydicom.pixels.decoders.gdcm", "pydicom.pixels.encoders.gdcm")
_lock = threading.Lock()


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
            # Only what is not being imported by now: pydicom may be imported from
            # inside another package's import of requests, whose entry must stay.
            hiding = [name for name in hidden if name not in sys.modules]
            for name in hiding:
                sys.modules[name] = None  # type: ignore[assignment]  # import -> ImportError
            try:
                exec_module(module)
            finally:
                for name in hiding:
                    if name in sys.modules and sys.modules[name] is None:
                        del sys.modules[name]
            if "gdcm" in hiding:
                for name in _GDCM_MODULES:  # imported again, with gdcm, on first use
                    sys.modules.pop(name, None)
                _install_stand_ins()

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


def _install_stand_ins() -> None:
    """GDCM's plugin back first in every coder that pydicom's import found it missing
    from, as a stand-in that loads the real one when first called."""
    from pydicom.pixels.decoders.base import _PIXEL_DATA_DECODERS
    from pydicom.pixels.encoders.base import _PIXEL_DATA_ENCODERS

    for table, import_path in (
        (_PIXEL_DATA_DECODERS, ("pydicom.pixels.decoders.gdcm", "_decode_frame")),
        (_PIXEL_DATA_ENCODERS, ("pydicom.pixels.encoders.gdcm", "encode_pixel_data")),
    ):
        for coder, _ in table.values():
            if "gdcm" in coder._unavailable:
                stand_in = _stand_in(coder, import_path)
                # one assignment: a decode on another thread never sees a half table
                coder._available = {"gdcm": stand_in, **coder._available}
                del coder._unavailable["gdcm"]
                _stand_ins.append((coder, import_path, stand_in))


_stand_ins: list[tuple[Any, tuple[str, str], Callable[..., Any]]] = []


def _stand_in(coder: Any, import_path: tuple[str, str]) -> Callable[..., Any]:
    def gdcm_plugin(*args: Any, **kwargs: Any) -> Any:
        return _load(coder, import_path)(*args, **kwargs)

    return gdcm_plugin


def _load(coder: Any, import_path: tuple[str, str]) -> Callable[..., Any]:
    """GDCM's real plugin function for ``coder``, put in the stand-in's place (the same
    key keeps its position); a coder the real plugin does not serve loses the entry,
    and the call fails so that pydicom tries its next plugin."""
    with _lock:
        module = importlib.import_module(import_path[0])
        if module.is_available(coder.UID):
            function: Callable[..., Any] = getattr(module, import_path[1])
            coder._available["gdcm"] = function
            return function
        coder._available.pop("gdcm", None)
        coder._unavailable["gdcm"] = getattr(
            module, "DECODER_DEPENDENCIES", getattr(module, "ENCODER_DEPENDENCIES", {})
        ).get(coder.UID, ())
    raise RuntimeError(f"GDCM does not serve transfer syntax {coder.UID}")


def gdcm_loaded() -> bool:
    """Whether GDCM's real plugin has been loaded in this process."""
    return "gdcm" in sys.modules


def load_gdcm() -> None:
    """Load GDCM's real plugin into every coder still holding a stand-in (the benchmark
    baselines: their timings should not include the first use's import)."""
    for coder, import_path, stand_in in _stand_ins:
        if coder._available.get("gdcm") is stand_in:
            with contextlib.suppress(RuntimeError):  # a coder GDCM turns out not to serve
                _load(coder, import_path)
