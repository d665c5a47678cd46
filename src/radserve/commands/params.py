"""Option types every command shares, so a number the code cannot use is a usage error.

click's ``FloatRange`` lets NaN through: NaN fails every comparison, so it is never
below a minimum nor above a maximum (``radserve plan --hours nan`` simulated forever,
``radserve bench --load nan`` ran a whole benchmark, ``radserve phantom --slice-spacing
nan`` ended in a traceback). Seeds feed numpy, which refuses negative ones with a
traceback.
"""

from __future__ import annotations

import math
from typing import Any

import click

from radserve.config import MAX_DURATION_S

SEED = click.IntRange(0, 2**32 - 1)  # numpy's SeedSequence entropy, one word


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and infinity."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def positive_seconds() -> FiniteFloatRange:
    """A number of seconds above 0 and at most a year, as a duration setting is
    (``gateway echo --timeout 1e300`` overflowed the socket's timeout: a traceback)."""
    return FiniteFloatRange(min=0, min_open=True, max=MAX_DURATION_S)


__all__ = ["SEED", "FiniteFloatRange", "positive_seconds"]
