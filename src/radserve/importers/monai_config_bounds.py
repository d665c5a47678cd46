"""How much a checked MONAI config expression may build while radserve imports it.

:mod:`monai_config_guard` bounds what an expression may call, not how much it computes:
``10**10**10``, ``[0]*999999999`` or ``list(range(10**12))`` are in its grammar and would
hang ``radserve models import`` or exhaust its memory. A static rule cannot be complete
(``@`` references bring plain config values into an expression), so the checked
expression is evaluated with its size-making operations routed through :class:`Budget`:
``**``, ``*``, ``<<``, ``range`` and the container calls, and every step of a
comprehension. One expression may make at most :data:`MAX_ELEMENTS` elements (repetition,
containers, comprehension steps together) and integers of at most :data:`MAX_INT_BITS`
bits; past either it is refused, naming the limit.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["MAX_ELEMENTS", "MAX_INT_BITS", "Budget", "BudgetExceededError", "evaluate"]

MAX_ELEMENTS = 10_000_000  # ~80 MB of list slots; the zoo's expressions make a handful
MAX_INT_BITS = 256  # shapes, seeds and sizes fit; 10**10**10 does not
_NAME = "__rs_budget"
_OPS: dict[type, str] = {ast.Pow: "pow", ast.Mult: "mul", ast.LShift: "lshift", ast.Mod: "mod"}
_FUNCTIONS: dict[str, Callable[[Any, Any], Any]] = {
    "pow": operator.pow, "mul": operator.mul, "lshift": operator.lshift, "mod": operator.mod
}  # fmt: skip
_SIZED_CALLS = frozenset({"list", "tuple", "dict", "sorted", "range"})


class BudgetExceededError(Exception):
    """An expression would build more than its :class:`Budget` allows."""


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Budget:
    """The elements one expression has made so far, and the operations that count them."""

    def __init__(self) -> None:
        self.used = 0

    def charge(self, count: int, what: str) -> None:
        self.used += max(int(count), 0)
        if self.used > MAX_ELEMENTS:
            raise BudgetExceededError(
                f"would make more than {MAX_ELEMENTS:,} elements ({what}; the limit MAX_ELEMENTS)"
            )

    def _bits(self, bits: int, what: str) -> None:
        if bits > MAX_INT_BITS:
            raise BudgetExceededError(
                f"would make an integer of about {bits:,} bits ({what}; the limit MAX_INT_BITS"
                f" = {MAX_INT_BITS})"
            )

    def binop(self, op: str, left: Any, right: Any) -> Any:
        if op == "pow" and _int(left) and _int(right) and right > 0 and abs(left) > 1:
            self._bits(right * (abs(left).bit_length() - 1), "**")
        elif op == "lshift" and _int(left) and _int(right):
            self._bits(left.bit_length() + right, "<<")
        elif op == "mul" and _int(left) and _int(right):
            self._bits(left.bit_length() + right.bit_length(), "*")
        elif op == "mul" and (_int(left) or _int(right)):
            seq, times = (right, left) if _int(left) else (left, right)
            if isinstance(seq, str | bytes | list | tuple):
                self.charge(len(seq) * max(times, 0), "sequence repetition")
        elif op == "mod" and isinstance(left, str | bytes):
            raise BudgetExceededError("formats a string with % (its width is unbounded)")
        return _FUNCTIONS[op](left, right)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is range:
            result = range(*args, **kwargs)
            self.charge(len(result), "range")
            return result
        if args and hasattr(args[0], "__len__"):
            self.charge(len(args[0]), f"{getattr(fn, '__name__', 'call')}()")
        return fn(*args, **kwargs)

    def steps(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            self.charge(1, "comprehension steps")
            yield item


class _Route(ast.NodeTransformer):
    def _budget(self, attr: str) -> ast.expr:
        return ast.Attribute(ast.Name(_NAME, ast.Load()), attr, ast.Load())

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if type(node.op) not in _OPS:
            return node
        name = ast.Constant(_OPS[type(node.op)])
        return ast.Call(self._budget("binop"), [name, node.left, node.right], [])

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in _SIZED_CALLS:
            return ast.Call(self._budget("call"), [node.func, *node.args], node.keywords)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.iter = ast.Call(self._budget("steps"), [node.iter], [])
        return node


def bounded_code(tree: ast.Expression) -> Any:
    """``tree`` (a checked expression) compiled with its sizes counted by the
    :class:`Budget` bound to :data:`_NAME` in the globals it is evaluated with."""
    routed = ast.fix_missing_locations(_Route().visit(tree))
    return compile(routed, "<monai config expression>", "eval")


def evaluate(tree: ast.Expression, globals_: dict[str, Any], locals_: Any) -> Any:
    """``tree`` evaluated under a fresh :class:`Budget`."""
    return eval(bounded_code(tree), {**globals_, _NAME: Budget()}, locals_)
