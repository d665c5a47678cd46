"""Work done label by label, spread over threads (issue 19 goal 1: both cores busy).

Between the organ network's last batch and the lesion network's first, the organ map's
clean-up and measurements ran on one thread while the other core idled: the lesion
step's region of interest needs them finished. Each label's part reads and writes only
voxels of that label (and background, for a drop) inside the label's own box, so the
labels can go to different threads and the result is the one of any order. numpy's
array loops and cc3d's labelling let go of the GIL, so the threads run at once.

The heaviest labels (largest boxes) start first, so the threads end together rather
than one waiting for a lung that started last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from typing import TypeVar

from radserve.models.manifest import LabelSpec
from radserve.preprocess.crop import BBox

T = TypeVar("T")
R = TypeVar("R")


def map_labels(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    threads: int = 1,
    weight: Callable[[T], float] | None = None,
) -> list[R]:
    """``[fn(item) for item in items]``, on up to ``threads`` threads when more than one.

    ``fn`` must touch only what belongs to its item. Items start in decreasing
    ``weight`` (their order when none); results come back in ``items``' order; the first
    failure is raised once every started item has ended. Each item runs in a copy of
    the caller's context, so a routine job's :func:`~radserve.checkpoints.checkpoint`
    still yields to URGENT work on the pool's threads.
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    order = range(len(items))
    if weight is not None:
        order = sorted(order, key=lambda i: -weight(items[i]))  # type: ignore[assignment]
    workers = min(threads, len(items))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radserve-labels") as pool:
        futures = {i: pool.submit(copy_context().run, fn, items[i]) for i in order}
        try:
            return [futures[i].result() for i in range(len(items))]
        except BaseException:
            pool.shutdown(cancel_futures=True)  # no item starts after a failure
            raise


def box_voxels(boxes: Sequence[BBox | None]) -> Callable[[LabelSpec], float]:
    """:func:`map_labels`' ``weight`` for labels whose boxes (by value ``1..``) are
    ``boxes``: the voxels of the label's box, 0 when it is absent."""

    def weight(label: LabelSpec) -> float:
        box = boxes[label.value - 1]
        return 0.0 if box is None else float(math.prod(s.stop - s.start for s in box))

    return weight


__all__ = ["box_voxels", "map_labels"]
