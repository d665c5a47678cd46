"""Replicas must configure the same destinations (the lane share assumes it): each
writes a digest per destination with its lease renewal and names what another replica
configures differently (radserve.store.replica_config), on /readyz (degraded) and in one
log line per change. Two replicas (two stores, two lease keepers) on PostgreSQL."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import settings_for
from tests.factories.waits import until

from radserve.config import DicomPeer
from radserve.service import Service
from radserve.service.leases import LeaseKeeper
from radserve.service.replica_config import destination_digests
from radserve.service.service import Readiness
from radserve.store import Lease, Store, init_store
from radserve.store.replica_config import differences

pytestmark = requires_postgres
LEASE_S = 30.0
PACS = DicomPeer("PACS", "10.0.0.5", 104)
MOVED = DicomPeer("PACS", "10.0.0.6", 104)  # the same name elsewhere


def _keeper(store: Store, instance: str, destinations: dict[str, str]) -> LeaseKeeper:
    return LeaseKeeper(
        store,
        Lease.new(instance, LEASE_S),
        shared=True,
        poll_s=5.0,
        on_claimed=lambda claimed: None,
        destinations=destinations,
    )


def _digests(
    tmp_path: Path, *peers: DicomPeer, fhir: str | None = None, gateway: bool = True
) -> dict[str, str]:
    settings = settings_for(
        tmp_path,
        gateway__enabled=gateway,
        gateway__allowed_peers=peers,
        fhir__url=fhir,
        outbox__replicas=2,
    )
    return destination_digests(settings)


def test_only_the_destinations_a_replica_sends_to_are_recorded_and_compared(
    tmp_path: Path,
) -> None:
    """A replica whose gateway is off sends no DICOM: its allowed peers are not recorded,
    and no DICOM destination is compared with it (before session 19 its allow-list was
    recorded and a peer listed there differently was named as a difference); a kind
    both send is compared name by name, a destination one of them lacks included."""
    sends = _digests(tmp_path, PACS, fhir="https://ehr.example/fhir")
    receives_only = _digests(tmp_path, MOVED, fhir="https://ehr.example/fhir", gateway=False)
    assert set(receives_only) == {"fhir:fhir"}
    assert differences(sends, {"replica-b": receives_only}) == []
    assert differences(receives_only, {"replica-a": sends}) == []
    archive = {**sends, "dicom:ARCHIVE": "0" * 16}
    assert differences(archive, {"replica-a": sends}) == [
        "destination dicom:ARCHIVE is configured here but not on replica-a"
    ]
    no_fhir = {"dicom:PACS": sends["dicom:PACS"]}  # sends no FHIR: nothing to compare
    assert differences(no_fhir, {"replica-a": sends}) == []


def test_a_replica_configured_differently_is_named_by_destination(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.service.leases")
    same = _digests(tmp_path, PACS, fhir="https://ehr.example/fhir")
    moved = _digests(tmp_path, DicomPeer("PACS", "10.0.0.6", 104), fhir="https://ehr.example/fhir")
    assert set(same) == {"dicom:PACS", "fhir:fhir"} and same != moved
    assert _digests(tmp_path, PACS, fhir="https://ehr.example/fhir") == same  # stable
    with postgres_schema("radserve_replicas") as url:
        stores = [init_store(url), init_store(url)]
        try:
            a, b = _keeper(stores[0], "replica-a", same), _keeper(stores[1], "replica-b", same)
            a.renew()
            b.renew()
            assert a.config_differences == [] and b.config_differences == []

            # replica B restarts with the PACS at another host and an archive A lacks
            b = _keeper(stores[1], "replica-b", {**moved, "dicom:ARCHIVE": "0" * 16})
            b.renew()
            a.renew()
            assert b.config_differences == [
                "destination dicom:ARCHIVE is configured here but not on replica-a",
                "destination dicom:PACS is configured differently on replica-a",
            ]
            assert a.config_differences == [
                "destination dicom:ARCHIVE is configured on replica-b but not here",
                "destination dicom:PACS is configured differently on replica-b",
            ]
            b.renew()  # nothing new: no second line
            said = [r.getMessage() for r in caplog.records]
            assert len([m for m in said if "configured the same on every" in m]) == 2, said
            assert all("10.0.0" not in m for m in said), said  # names, not the settings

            b = _keeper(stores[1], "replica-b", same)  # fixed and restarted
            b.renew()
            a.renew()
            assert a.config_differences == [] and b.config_differences == []
            assert caplog.records[-1].getMessage() == (
                "replicas: the destinations are configured the same again"
            )
        finally:
            for store in stores:
                store.close()


def test_readyz_lists_the_differences_as_degraded() -> None:
    differs = "destination dicom:PACS is configured differently on replica-a"
    state = Readiness(True, True, True, (), config_differences=(differs,))
    assert state.ready and state.degraded and differs in state.reasons
    assert state.without_key().reasons[-1].startswith("the API key could not be checked")
    assert differs not in state.without_key().reasons  # destinations need a key


def test_two_servers_on_one_database_say_which_destination_differs(tmp_path: Path) -> None:
    with postgres_schema("radserve_replicas") as url:
        services = [
            Service(
                settings_for(
                    tmp_path / name,
                    database_url=url,
                    jobs__lease_s=3.0,  # renewed (and compared) every second
                    outbox__replicas=2,
                    outbox__instance_id=name,
                    gateway__enabled=True,
                    gateway__port=0,
                    gateway__allowed_peers=(peer,),
                    # replicas of one chain share its key (each folder's own: refused)
                    audit__key_file=tmp_path / "audit.key",
                )
            )
            for name, peer in (
                ("replica-a", PACS),
                ("replica-b", DicomPeer("PACS", "10.0.0.6", 11112)),
            )
        ]
        for service in services:
            service.start(warm_up=False)
        try:
            for service, other in zip(services, ("replica-b", "replica-a"), strict=True):
                differs = f"destination dicom:PACS is configured differently on {other}"
                state = until(
                    lambda service=service, differs=differs: _naming(service, differs),
                    f"{other}'s peer to name the difference",
                    60,
                    state=lambda service=service: service.readiness().reasons,
                )
                assert state.degraded, state
        finally:
            for service in services:
                service.stop()


def _naming(service: Service, differs: str) -> Readiness | None:
    state = service.readiness()
    return state if differs in state.reasons else None
