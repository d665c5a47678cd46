"""A leading underscore means "this module's own": no package of radserve imports another
package's private name. What two packages share is public, defined once, in the layer
both may import (the import-linter contracts in pyproject.toml keep the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import radserve

SOURCE = Path(radserve.__file__).parent


def _package(module: str) -> str:
    """The top-level package (or module) of ``radserve.<package>...``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private_imports_across_packages() -> list[str]:
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE.parent).with_suffix("")
        importer = ".".join(relative.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if not node.module.startswith("radserve.") or (
                _package(node.module) == _package(importer)
            ):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{importer}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_no_package_imports_another_packages_private_names() -> None:
    assert _private_imports_across_packages() == []
