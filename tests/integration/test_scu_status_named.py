"""A PACS answering C-STOREs with failure, warning, odd and unknown statuses, through
the outbox to a real pynetdicom acceptor on loopback (tests/factories/awkward_peer.py):
each row's reason says what the status means, not only its code.

Found on 2026-12-07: a row read "C-STORE status 0xC123 from PACS" (an operator had to
look the code up), and a status DICOM does not define for C-STORE (a PACS's own, or
0xFF00 "pending", which is no final answer) read just like a defined failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.awkward_peer import scripted_peer

from radserve.gateway.outbox import Outbox, RetryPolicy
from radserve.gateway.scu import StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxState, OutboxStore


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    phantom = generate_phantom(PhantomSpec.random(7, small=True), range(10, 11))
    return write_dicom_series(phantom, tmp_path_factory.mktemp("study"))


@pytest.mark.parametrize(
    ("status", "state", "meaning"),
    [
        (0xB000, OutboxState.SENT, "(warning: elements coerced, stored)"),
        (0xB123, OutboxState.SENT, "(warning: stored)"),
        (0xA700, OutboxState.PENDING, "(refused: out of resources)"),
        (0xC000, OutboxState.FAILED_PERMANENT, "(error: cannot understand)"),
        (0xC123, OutboxState.FAILED_PERMANENT, "(error: cannot understand)"),
        (0xA900, OutboxState.FAILED_PERMANENT, "(error: data set does not match the SOP class)"),
        (0x0122, OutboxState.FAILED_PERMANENT, "(SOP class not supported by the destination)"),
        (0xFF00, OutboxState.FAILED_PERMANENT, "(pending, which is no final answer"),
        (0x1234, OutboxState.FAILED_PERMANENT, "(a status DICOM does not define for C-STORE)"),
        (0xABCD, OutboxState.FAILED_PERMANENT, "(a status DICOM does not define for C-STORE)"),
    ],
)
def test_each_status_is_named_on_the_row(
    rows: OutboxStore, study: list[Path], status: int, state: OutboxState, meaning: str
) -> None:
    with scripted_peer(statuses=(status,)) as peer:
        outbox = Outbox(rows, [peer.destination], StoreSCU(), policy=RetryPolicy())
        outbox.enqueue(study)
        outbox.deliver_pending()
    [row] = rows.items()
    assert row.state is state, row
    assert row.last_error is not None
    assert row.last_error.startswith(f"C-STORE status 0x{status:04X} {meaning}"), row.last_error
