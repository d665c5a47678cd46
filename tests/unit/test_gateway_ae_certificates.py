"""``gateway.ae_certificates``: the setting as loaded (identities normalised, mistakes
refused at load in one line), and the rule it sets (table-driven, on certificates'
identities; the real associations are tests/integration/test_gateway_tls_ae_certificates.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from radserve.config import GatewaySettings, TlsSettings
from radserve.gateway.config import CertificateBinding, PeerCertificate

CT = "ab" * 32
OTHER = "cd" * 32
TLS = TlsSettings(cert=Path("server.pem"), key=Path("server.key"), ca=Path("ca.pem"))


def _gateway(**values: object) -> GatewaySettings:
    return GatewaySettings(tls=TLS, **values)


def test_identities_are_normalised() -> None:
    openssl = ":".join(CT[i : i + 2] for i in range(0, 64, 2)).upper()
    gateway = _gateway(
        ae_certificates={" CT1 ": [f"SHA256:{openssl}", "CN: ct-scanner-1 ", f"sha256:{CT}"]}
    )
    assert gateway.ae_certificates == {"CT1": (f"sha256:{CT}", "cn:ct-scanner-1")}


@pytest.mark.parametrize(
    ("identities", "problem"),
    [
        (["ct-scanner-1"], "names no certificate: write cn:"),
        (["cn:"], "names no certificate"),
        (["sha256:abcd"], "names no certificate"),
        (["sha1:" + "ab" * 20], "names no certificate"),
        ([], "list at least one certificate"),
    ],
)
def test_a_mistaken_identity_is_refused_at_load(identities: list[str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        _gateway(ae_certificates={"CT1": identities})


def test_a_bad_ae_title_is_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="not a valid DICOM AE title"):
        _gateway(ae_certificates={"A\\B": ["cn:x"]})


@pytest.mark.parametrize(
    "tls",
    [None, TlsSettings(cert=Path("s.pem"), key=Path("s.key")), TlsSettings(ca=Path("ca.pem"))],
)
def test_ae_certificates_need_an_scp_that_asks_for_client_certificates(
    tls: TlsSettings | None,
) -> None:
    with pytest.raises(ValidationError, match="only over TLS with a CA"):
        GatewaySettings(tls=tls, ae_certificates={"CT1": ["cn:ct"]})


def test_the_default_ties_nothing() -> None:
    assert GatewaySettings().ae_certificates == {}
    assert not CertificateBinding({}).active


CERT_CT = PeerCertificate(sha256=CT, common_names=("CT-Scanner-1",))
CERT_WS = PeerCertificate(sha256=OTHER, common_names=("workstation",))
BINDING = CertificateBinding({"CT1": (f"sha256:{CT}",), "MR1": ("cn:ct-scanner-1",)})


@pytest.mark.parametrize(
    ("calling", "certificate", "refusal"),
    [
        ("CT1", CERT_CT, None),
        ("MR1", CERT_CT, None),  # by CN, without case: one device, two titles
        ("CT1", CERT_WS, "is not one gateway.ae_certificates lists for this AE title"),
        ("CT1", None, "no TLS client certificate"),
        ("OTHER", CERT_CT, "is tied to other AE titles"),
        ("OTHER", CERT_WS, None),
        ("OTHER", None, None),
    ],
)
def test_the_rule(calling: str, certificate: PeerCertificate | None, refusal: str | None) -> None:
    got = BINDING.refusal(calling, certificate)
    assert (got is None) == (refusal is None), got
    if refusal is not None:
        assert refusal in got


def test_the_fingerprint_is_written_as_openssl_does() -> None:
    assert CERT_CT.fingerprint == ":".join(["AB"] * 32)
