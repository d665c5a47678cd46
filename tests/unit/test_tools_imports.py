"""The measurement tools (tools/) and the test factories share code through
tests/factories (or the package), never by importing a test module: a test file is free
to change its helpers, and a tool that imported one broke with it (two tools imported
tests/integration/test_nnunet_multichannel.py and tests/e2e/test_imported_model_serve.py
until session 18)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
TEST_MODULES = ("tests.unit", "tests.integration", "tests.e2e")


def _imported(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "tests":  # from tests import unit
                found += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_no_tool_or_factory_imports_a_test_module() -> None:
    sources = sorted([*(ROOT / "tools").rglob("*.py"), *(ROOT / "tests/factories").rglob("*.py")])
    assert len(sources) > 20, sources  # the folders are where this test looks
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sources
        for line, module in _imported(path)
        if any(module == m or module.startswith(f"{m}.") for m in TEST_MODULES)
    ]
    assert offending == []
