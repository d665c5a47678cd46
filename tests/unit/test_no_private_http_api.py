"""radserve uses only httpx's and httpcore's public API: a private name (``httpx._utils``)
may change in any release of theirs, and pyproject.toml pins neither. Found on
2026-12-07: radserve.http_deadline imported ``httpx._utils.get_environment_proxies`` (and
replaced the private pool of an ``httpx.HTTPTransport`` subclass: its transport is now
an ``httpx.BaseTransport`` of its own over httpcore's public pool)."""

from __future__ import annotations

import ast
from pathlib import Path

import radserve

SOURCE = Path(radserve.__file__).parent


def _private_uses(tree: ast.AST) -> list[str]:
    """``import httpx._x``, ``from httpx._x import ...`` and ``httpx._x`` (httpcore too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(("httpx._", "httpcore._"))]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(("httpx._", "httpcore._")):
                found.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("httpx", "httpcore"):
                found.append(f"{base.id}.{node.attr}")
    return found


def test_no_module_uses_a_private_name_of_httpx_or_httpcore() -> None:
    uses = {
        str(path.relative_to(SOURCE)): found
        for path in sorted(SOURCE.rglob("*.py"))
        if (found := _private_uses(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert uses == {}
