"""``tools/edge_probe.py`` loaded as a module, for the e2e tests that run its ``main``."""

from __future__ import annotations

from typing import Any

from tests.factories.tools import load_tool


def edge_probe() -> Any:
    return load_tool("edge_probe")
