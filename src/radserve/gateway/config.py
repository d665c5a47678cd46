"""What the gateway is configured with: the ``gateway.*`` settings themselves.

:class:`ScpConfig` is :class:`radserve.config.GatewaySettings` plus the folder received
files go to, so ``radserve serve``, ``radserve gateway scp`` and tests configure the
SCP with one set of knobs (no second mapping layer to forget a field in). Peers are
:class:`radserve.config.DicomPeer`; :class:`Destination` is a peer results are sent to.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from radserve.config import (
    ANY_HOST,
    DicomPeer,
    GatewaySettings,
    IngestSettings,
    TlsSettings,
    check_host,
)
from radserve.config import (
    check_ae_title as _check_ae_title,
)
from radserve.gateway.errors import GatewayConfigError
from radserve.ingest.policy import IngestPolicy
from radserve.validation_text import describe_problems

# An allowed peer (calling AE title @ host) is the settings' DicomPeer itself.
Peer = DicomPeer

__all__ = [
    "ANY_HOST",
    "AllowList",
    "CertificateBinding",
    "Destination",
    "Peer",
    "PeerCertificate",
    "ScpConfig",
    "TlsSettings",
    "check_ae_title",
    "destinations",
    "scp_config_from_settings",
]


def check_ae_title(value: str, what: str = "AE title") -> str:
    """The title without padding; a :class:`GatewayConfigError` naming ``what``."""
    try:
        return _check_ae_title(value)
    except ValueError as exc:
        raise GatewayConfigError(f"{what} {exc}") from None


class ScpConfig(GatewaySettings):
    """The gateway settings plus ``data_dir`` (received instances go to
    ``data_dir/incoming/<study>/``, quarantine/ for others) and the bounds on reading a
    received instance, from the ``ingest`` settings: ``max_file_bytes`` (the instance, and
    a Deflated one inflated), ``max_header_bytes`` and ``max_header_elements`` (its header in
    memory: the bounds STOW-RS and ingest read a header within)."""

    data_dir: Path
    # built directly (an SCP embedded in a process, the in-process tests), it receives in
    # that process unless asked; from the settings (radserve serve / gateway), the
    # gateway.receivers default applies (scp_config_from_settings)
    receivers: int = Field(default=1, ge=1, le=64)
    max_file_bytes: int = Field(default=IngestPolicy.max_file_bytes, gt=0)
    max_header_bytes: int = Field(default=IngestPolicy.max_header_bytes, gt=0)
    max_header_elements: int = Field(default=IngestPolicy.max_header_elements, gt=0)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise GatewayConfigError(
                f"invalid gateway configuration: {describe_problems(exc)}"
            ) from None


def scp_config_from_settings(
    gateway: GatewaySettings,
    data_dir: Path,
    ingest: IngestSettings | None = None,
    **overrides: Any,
) -> ScpConfig:
    """The SCP's configuration from the ``gateway`` settings (files under
    ``data_dir/gateway``) and the read bounds of the ``ingest`` settings, with
    ``overrides`` (command-line flags, tests) applied."""
    bounds = {}
    if ingest is not None:
        bounds = {
            "max_file_bytes": ingest.max_file_bytes,
            "max_header_bytes": ingest.max_header_bytes,
            "max_header_elements": ingest.max_header_elements,
        }
    values = {**dict(gateway), "data_dir": Path(data_dir) / "gateway", **bounds, **overrides}
    return ScpConfig(**values)


@dataclass(frozen=True)
class Destination:
    """A DICOM peer radserve sends results to (C-STORE SCU), named for the outbox.
    ``tls``: the client side of DICOM TLS (``ca`` verifies the peer);
    ``storage_commitment``: results count as delivered once it reports them committed."""

    name: str
    ae_title: str
    host: str
    port: int
    tls: TlsSettings | None = None
    # ask for storage commitment after storing; wait this long for the report
    storage_commitment: bool = False
    commitment_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ae_title", check_ae_title(self.ae_title, "destination"))
        try:
            check_host(self.host, f"destination {self.name!r}: host")
        except ValueError as exc:
            raise GatewayConfigError(str(exc)) from None
        if not 1 <= self.port <= 65535:
            raise GatewayConfigError(f"destination {self.name!r}: port {self.port} not in 1-65535")
        if not self.name or len(self.name) > 64:
            raise GatewayConfigError("a destination needs a name of 1-64 characters")

    def __str__(self) -> str:
        """``AE@host:port``, after the name when it says more than the AE title (the
        configured peers are named by theirs; ``gateway echo``'s peer has no other)."""
        peer = f"{self.ae_title}@{self.host}:{self.port}"
        return peer if self.name == self.ae_title else f"{self.name} ({peer})"


def destinations(gateway: GatewaySettings) -> list[Destination]:
    """The allowed peers that have a port: where results go (the PACS that sends a study
    is usually the one that wants its results), over TLS for peers with ``tls``.

    A destination is named by its AE title (the outbox's rows, ``/deliveries``, the
    storage commitment reports it sends back), so two peers with one AE title at
    different addresses (a primary archive and its DR copy) are refused: a
    :class:`GatewayConfigError` naming both. Before, one of them got every result and
    the other none, with nothing said. The same peer listed twice is one destination."""
    _check_unique_titles(gateway.allowed_peers)
    return [
        Destination(
            name=peer.ae_title,
            ae_title=peer.ae_title,
            host=peer.host,
            port=peer.port,
            tls=gateway.tls if peer.tls else None,
            storage_commitment=peer.storage_commitment,
            commitment_timeout_s=peer.commitment_timeout_s,
        )
        for peer in _unique(gateway.allowed_peers)
        if peer.port is not None
    ]


def _unique(peers: Iterable[DicomPeer]) -> list[DicomPeer]:
    """Each destination once (the same AE title, host and port listed twice: one)."""
    seen: set[tuple[str, str, int | None]] = set()
    out = []
    for peer in peers:
        key = (peer.ae_title, peer.host, peer.port)
        if peer.port is None or key not in seen:
            seen.add(key)
            out.append(peer)
    return out


def _check_unique_titles(peers: Iterable[DicomPeer]) -> None:
    """Two destinations (peers with a port) may not share an AE title."""
    first: dict[str, DicomPeer] = {}
    for peer in peers:
        if peer.port is None:
            continue
        seen = first.setdefault(peer.ae_title, peer)
        if (seen.host, seen.port) != (peer.host, peer.port):
            raise GatewayConfigError(
                f"gateway.allowed_peers: destinations {seen.ae_title}@{seen.host}:{seen.port} "
                f"and {peer.ae_title}@{peer.host}:{peer.port} share the AE title "
                f"{peer.ae_title!r}: results would go to only one of them. Give each "
                "destination its own AE title (and that PACS the same title), or list "
                "one of them without a port (it may still send; it receives no results)"
            )


class AllowList:
    """Calling AE title + remote address -> allowed? Host names are resolved once, at
    start, so a DNS change needs a restart (and a slow resolver never delays an
    association)."""

    def __init__(self, peers: Iterable[DicomPeer]) -> None:
        self._peers: dict[str, set[str] | None] = {}
        for peer in peers:
            current = self._peers.get(peer.ae_title, set())
            if peer.host == ANY_HOST or current is None:
                self._peers[peer.ae_title] = None
            else:
                self._peers[peer.ae_title] = current | _resolve(peer.host)

    @property
    def addresses(self) -> frozenset[str]:
        """The addresses of peers listed with a host (not ``*``): known at the TCP level."""
        return frozenset(a for hosts in self._peers.values() if hosts for a in hosts)

    @property
    def open(self) -> bool:
        """No allow-list configured: every calling AE is accepted."""
        return not self._peers

    def allows(self, ae_title: str, address: str) -> bool:
        if self.open:
            return True
        title = ae_title.strip()
        if title not in self._peers:
            return False
        addresses = self._peers[title]
        return addresses is None or normalise_address(address) in addresses


def _resolve(host: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise GatewayConfigError(f"allowed peer host {host!r} cannot be resolved: {exc}") from exc
    return {normalise_address(str(info[4][0])) for info in infos}


def normalise_address(address: str) -> str:
    """One spelling per address (IPv4-mapped IPv6 -> IPv4), so comparisons are exact."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


@dataclass(frozen=True)
class PeerCertificate:
    """What identifies a TLS client's certificate to ``gateway.ae_certificates``."""

    sha256: str  # lowercase hex, no colons
    common_names: tuple[str, ...]

    @classmethod
    def of(cls, sock: object) -> PeerCertificate | None:
        """The certificate the peer of ``sock`` presented (verified by the handshake), or
        None: not TLS, or no certificate offered."""
        if not isinstance(sock, ssl.SSLSocket):
            return None
        der = sock.getpeercert(binary_form=True)
        if not der:
            return None
        subject = (sock.getpeercert() or {}).get("subject", ())
        names = tuple(str(value) for rdn in subject for key, value in rdn if key == "commonName")
        return cls(sha256=hashlib.sha256(der).hexdigest(), common_names=names)

    @property
    def fingerprint(self) -> str:
        """As ``openssl x509 -fingerprint -sha256`` prints it (``AB:CD:...``)."""
        digest = self.sha256.upper()
        return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))

    def identities(self) -> frozenset[str]:
        """Its names in the settings' normalised form (``sha256:hex``, ``cn:name``)."""
        return frozenset(
            [f"sha256:{self.sha256}", *(f"cn:{name.casefold()}" for name in self.common_names)]
        )


class CertificateBinding:
    """Calling AE title + TLS client certificate -> allowed? (``gateway.ae_certificates``)

    A title listed is accepted only with one of its certificates; a certificate listed
    (under any title) only as one of the titles it is listed under; titles and
    certificates listed nowhere as before. Nothing listed: every association passes, as
    before 2026-12-07, when any certificate the CA signed could call as any AE title.
    Common names compare without case; fingerprints are exact."""

    def __init__(self, tied: Mapping[str, Sequence[str]]) -> None:
        self._by_title = {
            title.strip(): frozenset(_casefold_cn(i) for i in identities)
            for title, identities in tied.items()
        }
        self._listed = frozenset().union(*self._by_title.values())

    @property
    def active(self) -> bool:
        return bool(self._by_title)

    def refusal(self, calling: str, certificate: PeerCertificate | None) -> str | None:
        """Why ``calling`` may not associate with ``certificate`` (a phrase for the log
        line), or None when it may."""
        if not self._by_title:
            return None
        held = certificate.identities() if certificate is not None else frozenset()
        allowed = self._by_title.get(calling.strip())
        if allowed is not None:
            if held & allowed:
                return None
            if certificate is None:
                return (
                    "no TLS client certificate, and gateway.ae_certificates ties this AE "
                    "title to one"
                )
            return (
                "its TLS client certificate is not one gateway.ae_certificates lists for "
                "this AE title"
            )
        if held & self._listed:
            return (
                "its TLS client certificate is tied to other AE titles in gateway.ae_certificates"
            )
        return None


def _casefold_cn(identity: str) -> str:
    kind, _, rest = identity.partition(":")
    return f"cn:{rest.casefold()}" if kind == "cn" else identity
