"""Gateway configuration values, the allow-list, and the SCU's context and status tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEG2000Lossless

from radserve.config import DicomPeer, GatewaySettings
from radserve.gateway import conformance
from radserve.gateway.config import (
    AllowList,
    Destination,
    Peer,
    ScpConfig,
    TlsConfig,
    scp_config_from_settings,
)
from radserve.gateway.errors import GatewayConfigError
from radserve.gateway.scp import build_ae
from radserve.gateway.scu import OutgoingFile, _batches, _contexts

SEG, SR, CT = conformance.SEGMENTATION, conformance.COMPREHENSIVE_3D_SR, "1.2.840.10008.5.1.4.1.1.2"


@pytest.mark.parametrize("title", ["", "   ", "A" * 17, "BAD\\AE", "TAB\tAE"])
def test_invalid_ae_titles_are_refused(tmp_path: Path, title: str) -> None:
    with pytest.raises(GatewayConfigError, match="not a valid DICOM AE title"):
        ScpConfig(data_dir=tmp_path, ae_title=title)


def test_destination_checks_port_and_name() -> None:
    with pytest.raises(GatewayConfigError, match="port 0 not in 1-65535"):
        Destination(name="pacs", ae_title="PACS", host="h", port=0)
    assert str(Destination("pacs", "PACS ", "h", 104)) == "pacs (PACS@h:104)"


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


def test_tls_server_needs_cert_and_key(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="needs both a certificate and a key"):
        TlsConfig(cert=tmp_path / "c.pem").server_context()
    with pytest.raises(GatewayConfigError, match="cannot load the TLS files"):
        TlsConfig(cert=tmp_path / "missing.pem", key=tmp_path / "k.pem").server_context()


def test_config_from_the_server_settings(tmp_path: Path) -> None:
    settings = GatewaySettings(
        ae_title="RS1",
        port=4104,
        allowed_peers=(DicomPeer(ae_title="PACS", host="127.0.0.1", port=104),),
    )
    config = scp_config_from_settings(settings, tmp_path, quiet_s=2.0)
    assert (config.ae_title, config.port, config.quiet_s) == ("RS1", 4104, 2.0)
    assert config.allowed_peers == (Peer("PACS", "127.0.0.1"),)
    assert config.data_dir == tmp_path / "gateway"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (conformance.UnwantedPolicy.QUARANTINE, set(conformance.ALL_STORAGE)),
        (conformance.UnwantedPolicy.REFUSE, set(conformance.IMAGE_STORAGE)),
    ],
)
def test_scp_negotiates_what_the_conformance_statement_lists(tmp_path, policy, expected) -> None:
    ae = build_ae(ScpConfig(data_dir=tmp_path, unwanted=policy))
    by_class = {str(cx.abstract_syntax): cx for cx in ae.supported_contexts}
    assert set(by_class) == {str(uid) for uid in expected} | {conformance.VERIFICATION}
    ct = by_class[CT]
    assert set(ct.transfer_syntax) == set(conformance.SCP_TRANSFER_SYNTAXES)
    assert "1.2.840.10008.1.2.4.201" in ct.transfer_syntax  # HTJ2K lossless
    assert SEG in expected if policy == "quarantine" else SEG not in expected


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
        (0xA700, False, True),
        (0xA7FF, False, True),
        (0x0110, False, True),
        (0xA900, False, False),
        (0xC000, False, False),
        (0x0122, False, False),
    ],
)
def test_store_status_classification(status: int, success: bool, retryable: bool) -> None:
    assert conformance.is_success(status) is success
    assert conformance.is_retryable_status(status) is retryable
