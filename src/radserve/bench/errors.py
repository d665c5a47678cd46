"""A benchmark that could not run to its end says why in one line (``radserve bench``
prints it as every command prints a :class:`~radserve.errors.RadserveError`), never as a
Python traceback."""

from __future__ import annotations

from radserve.errors import RadserveError


class BenchError(RadserveError):
    """A scenario could not measure what it set out to (a peer, a study, a child failed)."""

    code = "bench_failed"
