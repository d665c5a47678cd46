"""Multipart form uploads (``POST /v1/studies`` and ``/v1/studies/batch``): Starlette's
form parser under one :class:`~radserve.spool.SpoolBudget` per request, so that a
study's slices (each under Starlette's 1 MiB spool size) do not all stay in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from radserve.errors import InvalidRequestError
from radserve.spool import SpoolBudget


class _BudgetedParser(MultiPartParser):
    """Starlette's parser; each file's spool size is what the request's budget has left
    (``spool_max_size`` is read as each file part begins)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._budget = SpoolBudget()
        self._part_bytes = 0

    def on_headers_finished(self) -> None:
        # may raise TooManyPartsOnDiskError (413): Starlette closes the files parsed so far
        self.spool_max_size = self._budget.next_limit()
        self._part_bytes = 0
        super().on_headers_finished()

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        super().on_part_data(data, start, end)
        self._part_bytes += end - start

    def on_part_end(self) -> None:
        if self._current_part.file is not None:
            self._budget.ended(self._part_bytes, self.spool_max_size)
        super().on_part_end()


@asynccontextmanager
async def read_form(
    request: Request, *, max_files: int, max_fields: int
) -> AsyncIterator[FormData]:
    """The request's multipart form; its temporary files are closed on leaving."""
    async with aclosing(request.stream()) as stream:
        parser = _BudgetedParser(
            request.headers, stream, max_files=max_files, max_fields=max_fields
        )
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise InvalidRequestError(exc.message) from None
    try:
        yield form
    finally:
        await form.close()


__all__ = ["read_form"]
