"""Gateway settings as frozen values: who may send, where results go, TLS, policies.

These are plain dataclasses so the gateway is usable (and testable) without the server's
settings object; :func:`scp_config_from_settings` builds one from
:class:`radserve.config.GatewaySettings`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radserve.gateway.completeness import LatePolicy
from radserve.gateway.conformance import UnwantedPolicy
from radserve.gateway.errors import GatewayConfigError

# PS3.5 AE VR: up to 16 characters of the default repertoire, no backslash, no control
# characters, not only spaces.
_AE_TITLE = re.compile(r"^[\x20-\x5b\x5d-\x7e]{1,16}$")
ANY_HOST = "*"


def check_ae_title(value: str, what: str = "AE title") -> str:
    """The title without padding; a clear error if DICOM would not carry it."""
    title = value.strip()
    if not title or not _AE_TITLE.match(value):
        raise GatewayConfigError(
            f"{what} {value!r} is not a valid DICOM AE title: 1-16 printable ASCII "
            "characters, no backslash, not only spaces"
        )
    return title


@dataclass(frozen=True)
class TlsConfig:
    """DICOM TLS (PS3.15 B.1): our certificate and key, and the CA that signs peers.

    With ``ca`` set, peers must present a certificate signed by it (mutual TLS on the
    SCP, server verification on the SCU); without it the SCU does not verify the server.
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    # SCU: the name the server's certificate must carry (default: the destination host)
    server_hostname: str | None = None

    def server_context(self) -> ssl.SSLContext:
        if self.cert is None or self.key is None:
            raise GatewayConfigError("the TLS SCP needs both a certificate and a key file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(context)
        if self.ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            if self.cert is not None:
                context.load_cert_chain(str(self.cert), None if self.key is None else str(self.key))
            if self.ca is not None:
                context.load_verify_locations(cafile=str(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise GatewayConfigError(f"cannot load the TLS files: {exc}") from exc


@dataclass(frozen=True)
class Peer:
    """A calling AE allowed to associate; ``host`` ``"*"`` accepts it from any address."""

    ae_title: str
    host: str = ANY_HOST

    def __post_init__(self) -> None:
        object.__setattr__(self, "ae_title", check_ae_title(self.ae_title, "allowed peer"))


@dataclass(frozen=True)
class Destination:
    """A DICOM peer radserve sends results to (C-STORE SCU), named for the outbox."""

    name: str
    ae_title: str
    host: str
    port: int
    tls: TlsConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ae_title", check_ae_title(self.ae_title, "destination"))
        if not 1 <= self.port <= 65535:
            raise GatewayConfigError(f"destination {self.name!r}: port {self.port} not in 1-65535")
        if not self.name or len(self.name) > 64:
            raise GatewayConfigError("a destination needs a name of 1-64 characters")

    def __str__(self) -> str:
        return f"{self.name} ({self.ae_title}@{self.host}:{self.port})"


@dataclass(frozen=True)
class ScpConfig:
    """Everything the storage SCP is configured with."""

    data_dir: Path
    ae_title: str = "RADSERVE"
    host: str = "127.0.0.1"
    port: int = 11112  # 0: any free port (tests)
    # empty: any calling AE is accepted (logged as a warning at start)
    allowed_peers: tuple[Peer, ...] = ()
    require_called_ae_title: bool = True
    unwanted: UnwantedPolicy = UnwantedPolicy.QUARANTINE
    quiet_s: float = 10.0
    late_policy: LatePolicy = LatePolicy.RERUN
    # C-STORE answers 0xA700 when a write would leave less free space than this
    min_free_bytes: int = 512 * 1024**2
    max_associations: int = 16
    acse_timeout_s: float = 30.0
    dimse_timeout_s: float = 60.0
    network_timeout_s: float = 60.0
    tls: TlsConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ae_title", check_ae_title(self.ae_title, "the SCP's AE title"))
        if self.quiet_s <= 0:
            raise GatewayConfigError(f"quiet_s must be > 0 seconds, got {self.quiet_s}")
        if not 0 <= self.port <= 65535:
            raise GatewayConfigError(f"port {self.port} not in 0-65535")


class AllowList:
    """Calling AE title + remote address -> allowed? Host names are resolved once, at
    start, so a DNS change needs a restart (and a slow resolver never delays an
    association)."""

    def __init__(self, peers: Iterable[Peer]) -> None:
        self._peers: dict[str, set[str] | None] = {}
        for peer in peers:
            current = self._peers.get(peer.ae_title, set())
            if peer.host == ANY_HOST or current is None:
                self._peers[peer.ae_title] = None
            else:
                self._peers[peer.ae_title] = current | _resolve(peer.host)

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
        return addresses is None or _normalise(address) in addresses


def _resolve(host: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise GatewayConfigError(f"allowed peer host {host!r} cannot be resolved: {exc}") from exc
    return {_normalise(str(info[4][0])) for info in infos}


def _normalise(address: str) -> str:
    """One spelling per address (IPv4-mapped IPv6 -> IPv4), so comparisons are exact."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def scp_config_from_settings(gateway: Any, data_dir: Path, **overrides: Any) -> ScpConfig:
    """An :class:`ScpConfig` from :class:`radserve.config.GatewaySettings` (its
    ``ae_title``, ``port``, ``allowed_peers`` and any later field of the same name)."""
    values: dict[str, Any] = {"data_dir": Path(data_dir) / "gateway"}
    for name in ScpConfig.__dataclass_fields__:
        if name not in ("data_dir", "allowed_peers") and hasattr(gateway, name):
            values[name] = getattr(gateway, name)
    values["allowed_peers"] = tuple(
        Peer(ae_title=peer.ae_title, host=peer.host or ANY_HOST)
        for peer in getattr(gateway, "allowed_peers", ())
    )
    values.update(overrides)
    return ScpConfig(**values)
