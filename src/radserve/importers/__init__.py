"""Bring your own model: turn other frameworks' trained models into radserve bundles.

Each importer reads a framework's own folder layout, rebuilds the network with that
framework's code (an optional extra: torch is never a runtime dependency), exports it to
ONNX and writes a ``model.yaml`` that states the framework's preprocessing exactly. What
a bundle cannot express is refused (:class:`ImportRefusedError`), never approximated.
"""

from radserve.errors import ModelError


class ImportRefusedError(ModelError):
    """The source model does something a radserve bundle cannot express (or is broken)."""

    code = "model_import_refused"


__all__ = ["ImportRefusedError"]
