"""Recognising radserve's own results among received instances, so they never become input.

A PACS that holds radserve's SEG, SR and Secondary Capture key images re-sends them with
the study (Orthanc pushes every instance it holds). Taken as input, radserve's own key
images would be "new instances": a new job, a new set of results, sent back to the PACS,
re-sent again — a loop. Every intake (C-STORE SCP, STOW-RS, the REST upload) asks
:meth:`OwnResults.reason` first; an own result is acknowledged (the sender must not retry
it), logged by UID and counted, and never filed as input.

An instance is radserve's own when

- its SOP Instance UID is in radserve's result index (it wrote that instance, whatever
  a PACS may have coerced in its header since), or
- its Manufacturer (0008,0070) is radserve's, or
- an item of its Contributing Equipment Sequence (0018,A001) names radserve as
  Manufacturer (how IHE AIR names the algorithm that made a result).

The UID root is not used: radserve writes its UIDs under pydicom's root
(1.2.826.0.1.3680043.8.498), which other software shares, so a prefix test would drop
genuine input. Source images are never recognised: radserve does not modify them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from radserve.domain.equipment import MANUFACTURER
from radserve.ingest.headers import header_text

logger = logging.getLogger(__name__)

KnownInstance = Callable[[str], bool]  # SOP Instance UID -> radserve wrote it
OnIgnored = Callable[[str, str], None]  # (intake, reason)


def _text(dataset: Any, keyword: str) -> str:
    return header_text(dataset, keyword).rstrip("\x00").strip()


def _equipment(dataset: Any) -> list[Any]:
    try:
        return list(dataset.get("ContributingEquipmentSequence") or [])
    except Exception:  # a sequence pydicom cannot parse: no item names radserve
        return []


def _in_result_index(known: KnownInstance | None, sop_uid: str) -> bool:
    """The result index's answer; an index that cannot be asked (a database outage) is not
    evidence: the Manufacturer checks still apply, and the submission goes on to wait for
    the database where it needs it (its job row), as it did before session 17."""
    if known is None:
        return False
    try:
        return known(sop_uid)
    except Exception as exc:
        logger.debug("own-result check could not ask the result index (%s)", type(exc).__name__)
        return False


def own_result_reason(dataset: Any, known: KnownInstance | None = None) -> str | None:
    """Why ``dataset`` (a pydicom Dataset, header enough) is radserve's own result, or
    None when it is not. Never raises on damaged headers: a value that cannot be read
    does not make an instance radserve's."""
    sop_uid = _text(dataset, "SOPInstanceUID")  # each value read on its own (header_text):
    if sop_uid and _in_result_index(known, sop_uid):  # one unreadable value does not
        return "in the result index"  # hide another that names radserve
    if _text(dataset, "Manufacturer") == MANUFACTURER:
        return "Manufacturer is radserve"
    if any(_text(item, "Manufacturer") == MANUFACTURER for item in _equipment(dataset)):
        return "Contributing Equipment names radserve"
    return None


class OwnResults:
    """The check every intake shares, with a count of what it filtered (per intake)."""

    def __init__(
        self, known: KnownInstance | None = None, on_ignored: OnIgnored | None = None
    ) -> None:
        self.known = known
        self.on_ignored = on_ignored
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def reason(self, dataset: Any) -> str | None:
        return own_result_reason(dataset, self.known)

    def check(self, dataset: Any, intake: str) -> bool:
        """True (and logged, counted) when ``dataset`` is radserve's own result."""
        reason = self.reason(dataset)
        if reason is None:
            return False
        self.ignored(intake, _text(dataset, "SOPInstanceUID"), reason)
        return True

    def ignored(self, intake: str, sop_instance_uid: str, reason: str) -> None:
        logger.info(
            "%s: instance %s is radserve's own result (%s): acknowledged, not processed",
            intake,
            sop_instance_uid,
            reason,
        )
        with self._lock:
            self._counts[intake] += 1
        if self.on_ignored is not None:
            self.on_ignored(intake, reason)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


__all__ = ["KnownInstance", "OwnResults", "own_result_reason"]
