"""Gateway configuration values, the allow-list, and the SCU's context and status tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEG2000Lossless

from radserve.config import ConfigError, DicomPeer, GatewaySettings, TlsSettings, load_settings
from radserve.gateway import conformance
from radserve.gateway.config import (
    AllowList,
    Destination,
    Peer,
    ScpConfig,
    destinations,
    scp_config_from_settings,
)
from radserve.gateway.errors import GatewayConfigError
from radserve.gateway.scp import GatewaySCP, build_ae
from radserve.gateway.scu import Outcome, OutgoingFile, StoreSCU, _batches, _contexts
from radserve.gateway.transport import Admission
from radserve.tls import TlsConfigError, client_context, server_context

SEG, SR, CT = conformance.SEGMENTATION, conformance.COMPREHENSIVE_3D_SR, "1.2.840.10008.5.1.4.1.1.2"


@pytest.mark.parametrize("title", ["", "   ", "A" * 17, "BAD\\AE", "TAB\tAE"])
def test_invalid_ae_titles_are_refused(tmp_path: Path, title: str) -> None:
    with pytest.raises(GatewayConfigError, match="not a valid DICOM AE title"):
        ScpConfig(data_dir=tmp_path, ae_title=title)


def test_destination_checks_port_and_name() -> None:
    with pytest.raises(GatewayConfigError, match="port 0 not in 1-65535"):
        Destination(name="pacs", ae_title="PACS", host="h", port=0)
    assert str(Destination("pacs", "PACS ", "h", 104)) == "pacs (PACS@h:104)"
    assert str(Destination("PACS", "PACS", "h", 104)) == "PACS@h:104"  # named by its AE


def test_allow_list_matches_title_and_host() -> None:
    allow = AllowList(
        [
            Peer("PACS", "127.0.0.1"),
            Peer("CT1", "localhost"),
            Peer("ANYWHERE"),
            Peer("PACS", "10.0.0.1"),
        ]
    )
    assert allow.allows("PACS", "127.0.0.1") and allow.allows("PACS ", "10.0.0.1")
    assert allow.allows("PACS", "::ffff:127.0.0.1")  # IPv4-mapped IPv6
    assert not allow.allows("PACS", "127.0.0.2")
    assert allow.allows("CT1", "127.0.0.1")
    assert allow.allows("ANYWHERE", "192.0.2.7")
    assert not allow.allows("STRANGER", "127.0.0.1")
    assert AllowList([]).open and AllowList([]).allows("ANYONE", "192.0.2.7")


def test_unresolvable_peer_host_is_a_config_error() -> None:
    with pytest.raises(GatewayConfigError, match="cannot be resolved"):
        AllowList([Peer("PACS", "no-such-host.invalid")])


def test_tls_settings_need_their_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cert and key go together"):
        TlsSettings(cert=tmp_path / "c.pem")
    with pytest.raises(TlsConfigError, match="needs both a certificate and a key"):
        server_context(TlsSettings(ca=tmp_path / "ca.pem"))
    with pytest.raises(TlsConfigError, match="cannot load the TLS files"):
        server_context(TlsSettings(cert=tmp_path / "missing.pem", key=tmp_path / "k.pem"))
    with pytest.raises(TlsConfigError, match="needs a CA to verify the server"):
        client_context(TlsSettings())


def test_tls_peers_need_a_ca_to_verify_them() -> None:
    peer = {"ae_title": "PACS", "host": "10.0.0.5", "port": 104, "tls": True}
    with pytest.raises(ConfigError, match=r"set gateway\.tls\.ca"):
        load_settings(None, gateway__allowed_peers=[peer])
    with pytest.raises(ConfigError, match="a port or tls needs a host"):
        load_settings(None, gateway__allowed_peers=[{"ae_title": "PACS", "port": 104}])


def test_every_gateway_knob_is_a_setting(tmp_path: Path) -> None:
    """What `radserve serve` reads from the config file reaches the SCP and the SCU."""
    peer = {"ae_title": "PACS", "host": "127.0.0.1", "port": 104, "tls": True}
    settings = load_settings(
        None,
        data_dir=str(tmp_path),
        gateway__host="0.0.0.0",
        gateway__quiet_s=2.5,
        gateway__late_policy="flag",
        gateway__unwanted="refuse",
        gateway__max_associations=5,
        gateway__max_associations_per_host=2,
        gateway__reserved_for_peers=1,
        gateway__pdu_timeout_s=7,
        gateway__acse_timeout_s=3,
        gateway__dimse_timeout_s=4,
        gateway__network_timeout_s=5,
        gateway__tls={"ca": str(tmp_path / "ca.pem")},
        gateway__allowed_peers=[peer, {"ae_title": "CT1"}],
    )
    config = scp_config_from_settings(settings.gateway, settings.data_dir)
    assert config.host == "0.0.0.0" and config.data_dir == tmp_path / "gateway"
    assert (config.quiet_s, config.late_policy, config.unwanted) == (2.5, "flag", "refuse")
    ae = build_ae(config)
    assert (ae.maximum_associations, ae.acse_timeout, ae.dimse_timeout) == (5, 3, 4)
    assert ae.network_timeout == 5
    scp = GatewaySCP(config, lambda _study: None)
    assert (scp.admission.total, scp.admission.per_host, scp.admission.reserved) == (5, 2, 1)
    assert scp.admission.known == {"127.0.0.1"} and config.pdu_timeout_s == 7
    [pacs] = destinations(settings.gateway)
    assert (pacs.host, pacs.port, pacs.tls) == ("127.0.0.1", 104, settings.gateway.tls)
    scu = StoreSCU.from_settings(settings.gateway)
    assert scu._timeouts == (10.0, 3, 4, 5)


def test_config_from_the_server_settings(tmp_path: Path) -> None:
    settings = GatewaySettings(
        ae_title="RS1",
        port=4104,
        allowed_peers=(DicomPeer(ae_title="PACS", host="127.0.0.1", port=104),),
    )
    config = scp_config_from_settings(settings, tmp_path, quiet_s=2.0)
    assert (config.ae_title, config.port, config.quiet_s) == ("RS1", 4104, 2.0)
    assert config.allowed_peers == (Peer("PACS", "127.0.0.1", 104),)
    assert config.data_dir == tmp_path / "gateway"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (conformance.UnwantedPolicy.QUARANTINE, set(conformance.ALL_STORAGE)),
        # SEG and Comprehensive 3D SR stay accepted: radserve's own results get success
        (
            conformance.UnwantedPolicy.REFUSE,
            set(conformance.IMAGE_STORAGE + conformance.RESULT_STORAGE),
        ),
    ],
)
def test_scp_negotiates_what_the_conformance_statement_lists(tmp_path, policy, expected) -> None:
    ae = build_ae(ScpConfig(data_dir=tmp_path, unwanted=policy))
    by_class = {str(cx.abstract_syntax): cx for cx in ae.supported_contexts}
    assert set(by_class) == {str(uid) for uid in expected} | {conformance.VERIFICATION}
    ct = by_class[CT]
    assert set(ct.transfer_syntax) == set(conformance.SCP_TRANSFER_SYNTAXES)
    assert "1.2.840.10008.1.2.4.201" in ct.transfer_syntax  # HTJ2K lossless
    assert SEG in expected  # both policies: radserve's own SEGs are acknowledged
    assert ("1.2.840.10008.5.1.4.1.1.88.11" in expected) == (policy == "quarantine")  # Basic SR


def _file(key: int, sop_class: str, syntax: str) -> OutgoingFile:
    return OutgoingFile(key, Path(f"{key}.dcm"), sop_class, syntax, f"1.{key}")


def test_scu_proposes_only_the_contexts_its_files_need() -> None:
    files = [
        _file(1, SEG, ExplicitVRLittleEndian),
        _file(2, SR, ExplicitVRLittleEndian),
        _file(3, SR, ImplicitVRLittleEndian),
        _file(4, CT, JPEG2000Lossless),
    ]
    proposed = {(str(cx.abstract_syntax), tuple(cx.transfer_syntax)) for cx in _contexts(files)}
    uncompressed = (ExplicitVRLittleEndian, ImplicitVRLittleEndian)
    assert proposed == {(SEG, uncompressed), (SR, uncompressed), (CT, (JPEG2000Lossless,))}


def test_scu_splits_batches_beyond_128_contexts() -> None:
    files = [_file(k, f"1.2.3.{k}", ExplicitVRLittleEndian) for k in range(130)]
    assert [len(batch) for batch in _batches(files)] == [128, 2]


@pytest.mark.parametrize(
    ("status", "success", "retryable"),
    [
        (0x0000, True, False),
        (0xB000, True, False),
        (0xB007, True, False),
        (0xB006, True, False),
        (0xB123, True, False),  # a vendor's own warning: stored all the same
        (0x0001, True, False),
        (0x0107, True, False),
        (0xA700, False, True),
        (0xA7FF, False, True),
        (0x0110, False, True),
        (0xA900, False, False),
        (0xC000, False, False),
        (0x0122, False, False),
        (0xA801, False, False),
        (0xFE00, False, False),
    ],
)
def test_store_status_classification(status: int, success: bool, retryable: bool) -> None:
    assert conformance.is_success(status) is success
    assert conformance.is_retryable_status(status) is retryable


def test_admission_keeps_slots_for_allowed_peers() -> None:
    admission = Admission(total=4, per_host=2, reserved=1, known_addresses=["10.0.0.5"])
    assert admission.admit("192.0.2.1") and admission.admit("192.0.2.1")
    assert not admission.admit("192.0.2.1")  # per address
    assert admission.admit("192.0.2.2")
    assert not admission.admit("192.0.2.3")  # the last slot is the PACS's
    assert admission.admit("::ffff:10.0.0.5")  # the PACS, however it is spelt
    assert not admission.admit("10.0.0.5")  # and now every slot is in use
    admission.release("192.0.2.1")
    assert admission.admit("192.0.2.3")
    assert admission.open_connections() == {
        "192.0.2.1": 1,
        "192.0.2.2": 1,
        "192.0.2.3": 1,
        "10.0.0.5": 1,
    }


def test_without_known_addresses_nothing_is_reserved() -> None:
    admission = Admission(total=2, per_host=2, reserved=1, known_addresses=[])
    assert admission.admit("192.0.2.1") and admission.admit("192.0.2.1")
    with pytest.raises(ConfigError, match="reserved_for_peers must be less"):
        load_settings(None, gateway__max_associations=4, gateway__reserved_for_peers=4)


def test_known_addresses_are_the_peers_with_a_host() -> None:
    allow = AllowList([Peer("PACS", "127.0.0.1"), Peer("ANYWHERE")])
    assert allow.addresses == {"127.0.0.1"}


def test_quarantine_takes_in_private_and_newer_storage_classes_only() -> None:
    proposed = [
        "1.3.12.2.1107.5.9.1",  # Siemens CSA Non-Image Storage (private)
        "1.2.840.10008.5.1.4.1.1.2",  # CT Image Storage: listed already
        "1.2.840.10008.5.1.4.1.1.999",  # a storage class newer than pynetdicom
        "1.2.840.10008.1.20.1",  # Storage Commitment: a service, not storage
        "1.2.840.10008.1.2",  # a transfer syntax
        "1.3.12.2.1107.5.9.1",  # proposed twice
        "1.2.04.5",  # not a UID
        "Smith^Jane",
    ]
    listed = ["1.2.840.10008.5.1.4.1.1.2"]
    assert conformance.unlisted_storage(proposed, listed) == [
        "1.3.12.2.1107.5.9.1",
        "1.2.840.10008.5.1.4.1.1.999",
    ]


def test_unlisted_classes_taken_in_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from radserve.gateway import scp

    monkeypatch.setattr(scp, "MAX_UNLISTED_CLASSES", len(scp._registered))
    assert scp._register_storage("1.2.840.10008.5.1.4.1.1.2")  # known: always
    assert not scp._register_storage("1.3.6.1.4.1.99999.1.2.3")  # one more: refused


@pytest.mark.parametrize("host", ["pacs..hospital.local", "a" * 64, "bad host", "-pacs.local", ""])
def test_a_peer_host_that_is_no_address_or_host_name_is_refused_at_load(host: str) -> None:
    """Before, such a name passed and resolving it raised UnicodeError (the idna codec's
    "label empty or too long"): a traceback when the gateway started, an outbox
    "internal error" at every send, and one from `radserve gateway echo`."""
    peer = {"ae_title": "PACS", "host": host, "port": 104}
    with pytest.raises(ConfigError, match=r"gateway\.allowed_peers\.0\.host"):
        load_settings(None, gateway__allowed_peers=[peer])
    with pytest.raises(GatewayConfigError, match="neither an IP address nor a host name"):
        Destination(name="pacs", ae_title="PACS", host=host, port=104)


@pytest.mark.parametrize(
    "host", ["pacs_01.hospital.local", "PACS-2", "10.1.2.3", "fe80::1%eth0", "pacs."]
)
def test_addresses_and_host_names_pass(host: str) -> None:
    peer = {"ae_title": "PACS", "host": host, "port": 104}
    assert load_settings(None, gateway__allowed_peers=[peer]).gateway.allowed_peers[0].host == host


@pytest.mark.parametrize("section", ["server", "gateway"])
@pytest.mark.parametrize("host", ["", "pacs..hospital.local", "0.0.0.0 ", "a" * 64])
def test_a_bind_address_is_checked_at_load(section: str, host: str) -> None:
    """Before, an empty ``server.host`` or ``gateway.host`` (an unset variable in a
    deployment's environment, say) bound every interface without a word."""
    with pytest.raises(ConfigError, match=rf"{section}\.host.*neither an IP address"):
        load_settings(None, **{f"{section}__host": host})


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "localhost", "radserve-1.hospital.local"])
def test_bind_addresses_pass(host: str) -> None:
    settings = load_settings(None, server__host=host, gateway__host=host)
    assert (settings.server.host, settings.gateway.host) == (host, host)


def test_a_host_that_does_not_resolve_is_a_retry_with_the_reason_not_a_traceback() -> None:
    """A zone no interface has: the resolver fails on this host, without asking DNS (so
    the test sends nothing anywhere). A PACS renamed or DNS down reads the same."""
    scu = StoreSCU("RADSERVE", connect_timeout_s=1, acse_timeout_s=1, dimse_timeout_s=1)
    result = scu.echo(Destination("pacs", "PACS", "fe80::1%nosuchif", 104))
    assert result.outcome is Outcome.RETRY
    assert "cannot resolve 'fe80::1%nosuchif'" in result.message
