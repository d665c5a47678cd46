"""Awkward DICOM storage peers for the outbox's SCU, each a real acceptor on loopback.

- :func:`scripted_peer`: a pynetdicom acceptor answering chosen C-STORE statuses, with
  only chosen SOP classes, an association limit and a delay before each answer: what a
  PACS may answer and dcmtk's storescp cannot be told to (warnings, 0xA9xx, no SEG,
  A-ASSOCIATE-RJ "local limit", a slow answer after a status);
- :func:`storescp`: dcmtk's storescp with its own awkward options (``+xi`` implicit VR
  only, ``-pdu 4096``, ``--abort-after``, ``--sleep-during``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydicom.dataset import Dataset
from pynetdicom import AE, AllStoragePresentationContexts, build_context, evt

from radserve.gateway import Destination
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.ports import free_port
from tests.factories.serve import listening
from tests.factories.waits import wait_until


@dataclass
class ScriptedPeer:
    """What the peer was sent; ``destination`` addresses it."""

    destination: Destination
    received: list[Dataset] = field(default_factory=list)


@contextmanager
def scripted_peer(
    *,
    statuses: Sequence[int] = (0x0000,),
    sop_classes: Sequence[str] | None = None,
    max_associations: int = 10,
    comment: Callable[[Dataset], str] | None = None,
    delay_s: float = 0.0,
    accept_delay_s: float = 0.0,
) -> Iterator[ScriptedPeer]:
    """A peer answering the n-th C-STORE with ``statuses[n]`` (the last one repeats),
    with the Error Comment ``comment(data set)`` if given, ``delay_s`` after the request
    arrived (a slow PACS); ``sop_classes``: the only storage classes it accepts (default:
    all); ``accept_delay_s``: the wait before it answers an association request.
    ``received`` holds each data set with its file meta (``save_as`` writes it)."""
    ae = AE(ae_title="AWKWARD")
    ae.maximum_associations = max_associations
    if sop_classes is None:
        ae.supported_contexts = AllStoragePresentationContexts
    else:
        ae.supported_contexts = [build_context(uid) for uid in sop_classes]
    ae.add_supported_context("1.2.840.10008.1.1")  # Verification
    peer = ScriptedPeer(Destination("awkward", "AWKWARD", "127.0.0.1", free_port()))

    def store(event: evt.Event) -> Dataset:
        time.sleep(delay_s)
        dataset = event.dataset
        dataset.file_meta = event.file_meta
        peer.received.append(dataset)
        answer = Dataset()
        answer.Status = statuses[min(len(peer.received), len(statuses)) - 1]
        if comment is not None:
            answer.ErrorComment = comment(event.dataset)
        return answer

    server = ae.start_server(
        ("127.0.0.1", peer.destination.port),
        block=False,
        evt_handlers=[
            (evt.EVT_C_STORE, store),
            (evt.EVT_REQUESTED, lambda _event: time.sleep(accept_delay_s)),
        ],
    )
    try:
        yield peer
    finally:
        server.shutdown()


@contextmanager
def storescp(folder: Path, *options: str, port: int | None = None) -> Iterator[Destination]:
    """dcmtk's storescp writing to ``folder`` with ``options``; killed on exit."""
    binary = dcmtk_tool("storescp")
    assert binary is not None, "dcmtk's storescp is not installed"
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    command = [binary, "-aet", "STORESCP", "-od", str(folder), *options, str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    destination = Destination("storescp", "STORESCP", "127.0.0.1", port)
    try:
        up = wait_until(lambda: listening("127.0.0.1", port), 10, step=0.05)
        assert up, "storescp did not start"
        yield destination
    finally:
        process.kill()
        process.wait(10)
