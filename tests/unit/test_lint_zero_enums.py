"""A lint over ``src``: no truthiness test on a value whose zero is meaningful.

``PriorityClass.URGENT`` was once ``0`` (an ``IntEnum``), so ``priority or default``
silently replaced an urgent request by the default class (issue 12, item 10).
``PriorityClass`` is now a ``StrEnum`` whose members are all truthy (issue 13); the lint
stays for the ``IntEnum`` types that remain and any added later. This walks every
module's syntax tree and flags ``x or ...``, ``x and ...``, ``if x``, ``not x``,
``... if x else ...`` and ``while x`` where ``x`` is a name or attribute annotated (as
a parameter, variable or class field anywhere in ``src``) with an
``IntEnum``/``IntFlag`` defined in ``src`` or with ``int``/``float``-valued
zero-meaningful types listed below. A comparison (``x is None``, ``x == 0``) is the way
to say what is meant.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import radserve

SRC = Path(radserve.__file__).parent
INT_ENUM_BASES = {"IntEnum", "IntFlag"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def _int_enums(modules: list[tuple[Path, ast.Module]]) -> set[str]:
    """Names of the IntEnum/IntFlag classes defined in src (their first member may be 0)."""
    found = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & INT_ENUM_BASES:
                    found.add(node.name)
    return found


def _mentions(annotation: ast.expr | None, types: set[str]) -> bool:
    if annotation is None:
        return False
    words = set(re.findall(r"\w+", ast.unparse(annotation)))
    return bool(words & types)


def _enum_fields(modules: list[tuple[Path, ast.Module]], types: set[str]) -> set[str]:
    """Class fields annotated with one of ``types`` (read as ``obj.field``)."""
    fields = set()
    for _, tree in modules:
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                for node in cls.body:
                    if (
                        isinstance(node, ast.AnnAssign)
                        and isinstance(node.target, ast.Name)
                        and _mentions(node.annotation, types)
                    ):
                        fields.add(node.target.id)
    return fields


def _local_names(function: ast.FunctionDef | ast.AsyncFunctionDef, types: set[str]) -> set[str]:
    """Parameters and local variables of ``function`` annotated with one of ``types``."""
    args = function.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg for a in every if a is not None and _mentions(a.annotation, types)}
    for node in ast.walk(function):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _mentions(node.annotation, types)
        ):
            names.add(node.target.id)
    return names


def _offences(tree: ast.Module, types: set[str], fields: set[str]) -> Iterator[ast.expr]:
    """Truth-tested names typed with ``types`` in their function, and ``obj.field``."""
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = _local_names(function, types)
            for expr in _tested(function):
                if isinstance(expr, ast.Name) and expr.id in local:
                    yield expr
    for expr in _tested(tree):
        if isinstance(expr, ast.Attribute) and expr.attr in fields:
            yield expr


def _tested(tree: ast.Module) -> Iterator[ast.expr]:
    """Every expression used for its truth value."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp):
            yield from node.values[:-1]  # the last operand is returned, not tested
        elif isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            yield node.test
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node.operand
        elif isinstance(node, ast.comprehension):
            yield from node.ifs


def test_no_truthiness_test_on_int_enums() -> None:
    modules = _modules()
    enums = _int_enums(modules)
    assert "PriorityClass" not in enums  # a StrEnum now: its members are all truthy
    assert enums  # the lint still has IntEnum types to watch (e.g. Tissue)
    fields = _enum_fields(modules, enums)
    offences = [
        f"{path.relative_to(SRC)}:{expr.lineno}: {ast.unparse(expr)}"
        for path, tree in modules
        for expr in _offences(tree, enums, fields)
    ]
    assert not offences, (
        "truthiness test on an IntEnum value (its zero member is falsy); compare with "
        "`is None` instead:\n" + "\n".join(offences)
    )


def test_the_lint_catches_the_defect_it_was_written_for() -> None:
    """The lint finds ``priority or default`` as the code read before the fix."""
    tree = ast.parse(
        "def f(priority: PriorityClass | None, hit, job):\n"
        "    cls = priority or PriorityClass.parse(hit)\n"
        "    if not priority: pass\n"
        "    return job.cls and 1\n"
    )
    flagged = [ast.unparse(e) for e in _offences(tree, {"PriorityClass"}, {"cls"})]
    assert sorted(flagged) == ["job.cls", "priority", "priority"]
