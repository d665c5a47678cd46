"""``tools/edge_probe.py`` loaded as a module (tools/ is no package), for the e2e tests
that run its ``main``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

TOOL = Path(__file__).resolve().parents[2] / "tools" / "edge_probe.py"


def edge_probe() -> Any:
    spec = importlib.util.spec_from_file_location("edge_probe", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
