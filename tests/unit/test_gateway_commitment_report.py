"""Storage commitment reports (N-EVENT-REPORT) a peer may send malformed: refused with
a reason that names what is wrong, never the peer's values, and nothing raised into
pynetdicom's handler (before session 35 some raised TypeError, others were answered with
Python's message quoting the value, and a Transaction UID of 20,000 characters was
logged whole)."""

from __future__ import annotations

import pytest
from pydicom.dataset import Dataset

from radserve.gateway.commitment import CommitmentReport, answer
from radserve.gateway.conformance import Status


def _report(transaction: str = "2.25.77", **items: list[Dataset]) -> Dataset:
    info = Dataset()
    info.TransactionUID = transaction
    for keyword, sequence in items.items():
        setattr(info, keyword, sequence)
    return info


def _item(uid: str, reason: object = None) -> Dataset:
    item = Dataset()
    item.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.66.4"
    item.ReferencedSOPInstanceUID = uid
    if reason is not None:
        item.FailureReason = reason
    return item


def test_a_well_formed_report_is_read() -> None:
    info = _report(
        ReferencedSOPSequence=[_item("2.25.1")], FailedSOPSequence=[_item("2.25.2", 0x0112)]
    )
    report = CommitmentReport.from_event(info)
    assert report.committed == {"2.25.1"} and report.failed == {"2.25.2": 0x0112}


def _malformed() -> list[tuple[str, Dataset | None, str]]:
    two_reasons = _report(FailedSOPSequence=[_item("2.25.2", [0x0110, 0x0112])])
    text_reason = _report(FailedSOPSequence=[_item("2.25.2")])
    text_reason.FailedSOPSequence[0].add_new(0x00081197, "LO", "SECRET-REASON-1")
    not_a_sequence = _report()
    not_a_sequence.add_new(0x00081199, "UI", "2.25.99")
    return [
        ("two reasons", two_reasons, "FailedSOPSequence is not a sequence of items"),
        ("text reason", text_reason, "with one Failure Reason each"),
        ("no sequence", not_a_sequence, "ReferencedSOPSequence is not a sequence"),
        ("long uid", _report("1" * 20_000), "Transaction UID (20000 characters) is not"),
        ("text uid", _report("SECRET^UID"), "is not a valid UID"),
        ("no uid", _report(""), "carries no Transaction UID"),
        ("nothing", None, "carries no Event Information"),
    ]


@pytest.mark.parametrize(("case", "info", "said"), _malformed(), ids=[c[0] for c in _malformed()])
def test_a_malformed_report_is_refused_naming_what_is_wrong_never_its_values(
    case: str, info: Dataset | None, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    handled: list[CommitmentReport] = []
    status, comment = answer("PACS", info, lambda _ae, r: (handled.append(r), (0, ""))[1])
    assert status == Status.INVALID_ARGUMENT and not handled
    assert said in comment, comment
    logged = " ".join(r.getMessage() for r in caplog.records if r.name.startswith("radserve"))
    assert "refused" in logged
    for value in ("SECRET", "2.25.99", "1" * 100):
        assert value not in comment and value not in logged
    assert len(comment) < 200
