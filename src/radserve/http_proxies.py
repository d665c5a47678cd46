"""Which proxy the server's environment names for a URL, as curl reads the variables.

``HTTPS_PROXY`` for https URLs, ``HTTP_PROXY`` for http ones, ``ALL_PROXY`` for either
when its own is not set, lowercase or uppercase (read by the standard library's
:func:`urllib.request.getproxies_environment`: the lowercase one wins, and
``HTTP_PROXY`` in uppercase is ignored in a CGI process), minus the hosts ``NO_PROXY``
lists. A ``NO_PROXY`` entry is ``*`` (no proxy at all), a host name (that host and every
host under it; a leading ``.`` or ``*.`` changes nothing), an IP address, an IP network
in CIDR notation (``10.0.0.0/8``, ``fd00::/8``), any of these with ``:port`` (that port
only), or ``scheme://host`` (that scheme only).

Until 2026-12-07 radserve read these through a private function of httpx
(``httpx._utils.get_environment_proxies``), which a minor httpx release may rename or
remove; it also took a CIDR entry as a host name that matched nothing (a site listing
``10.0.0.0/8`` had its in-hospital receivers reached through its proxy), and an
``ALL_PROXY`` that named a SOCKS proxy failed at the first send with a traceback.
Only HTTP(S) proxies are used (httpcore's SOCKS support needs ``socksio``, which radserve
does not install): :func:`proxy_problems` names the URLs a configured sender would send
through another kind, and ``radserve serve`` refuses to start on them
(:mod:`radserve.lifecycle.doctor`).
"""

from __future__ import annotations

import ipaddress
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

SUPPORTED_SCHEMES = ("http", "https")  # of a proxy's own URL
_DEFAULT_PORTS = {"http": 80, "https": 443}

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class _Bypass:
    """One ``NO_PROXY`` entry."""

    host: str = ""  # a host name (matched with the hosts under it) or an address
    network: IPNetwork | None = None  # an address or a CIDR network
    port: int | None = None
    scheme: str | None = None

    @classmethod
    def parse(cls, entry: str) -> _Bypass | None:
        text = entry.strip().lower()
        scheme = None
        if "://" in text:  # scheme://host[:port][/path]: that scheme only
            scheme, _, text = text.partition("://")
            if not _is_network(text):
                text = text.split("/", 1)[0]
        text = text.removeprefix("*").lstrip(".")
        if not text:
            return None
        network = _network(text)
        if network is not None:
            return cls(network=network, scheme=scheme)
        host, port = _split_port(text)
        network = _network(host)
        if network is not None:
            return cls(network=network, port=port, scheme=scheme)
        return cls(host=host.rstrip("."), port=port, scheme=scheme)

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if self.scheme is not None and self.scheme != scheme:
            return False
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            address = _address(host)
            return address is not None and address in self.network
        return host == self.host or host.endswith("." + self.host)


def _is_network(text: str) -> bool:
    return _network(text) is not None


def _network(text: str) -> IPNetwork | None:
    """``text`` as an address (a network of one) or a CIDR network; None if neither."""
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        pass
    if text.startswith("[") and "]/" in text:  # [fd00::]/8
        try:
            return ipaddress.ip_network(text.replace("]", "").lstrip("["), strict=False)
        except ValueError:
            return None
    return None


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _split_port(text: str) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) -> (host, port); a bare host or address -> no port."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, colon, port = text.rpartition(":")
    if colon and port.isdigit() and ":" not in host:
        return host, int(port)
    return text, None


@dataclass(frozen=True)
class EnvironmentProxies:
    """The proxies an environment names: ``by_scheme`` maps ``http``/``https`` to a
    proxy URL (``ALL_PROXY`` filled in), ``named_by`` says which variable named each."""

    by_scheme: Mapping[str, str]
    named_by: Mapping[str, str]
    bypass: tuple[_Bypass, ...] = ()
    bypass_all: bool = False

    @classmethod
    def read(cls) -> EnvironmentProxies:
        """From this process's environment, as it is now."""
        variables = urllib.request.getproxies_environment()
        by_scheme: dict[str, str] = {}
        named_by: dict[str, str] = {}
        for scheme in SUPPORTED_SCHEMES:
            for name in (scheme, "all"):
                value = variables.get(name, "").strip()
                if value:
                    by_scheme[scheme] = value if "://" in value else f"http://{value}"
                    named_by[scheme] = f"{name.upper()}_PROXY"
                    break
        entries = [entry for entry in variables.get("no", "").split(",") if entry.strip()]
        bypass_all = any(entry.strip() == "*" for entry in entries)
        parsed = (_Bypass.parse(entry) for entry in entries)
        return cls(by_scheme, named_by, tuple(b for b in parsed if b is not None), bypass_all)

    def proxy_for(self, url: httpx.URL | str) -> str | None:
        """The proxy URL ``url`` goes through, or None (direct)."""
        url = httpx.URL(url)
        proxy = self.by_scheme.get(url.scheme)
        if proxy is None or self.bypass_all:
            return None
        host = url.host.lower().rstrip(".")
        port = url.port or _DEFAULT_PORTS.get(url.scheme, 0)
        if any(entry.matches(url.scheme, host, port) for entry in self.bypass):
            return None
        return proxy

    def usable(self) -> list[str]:
        """The proxy URLs named that radserve can send through (http:// and https://)."""
        return sorted({p for p in self.by_scheme.values() if _scheme(p) in SUPPORTED_SCHEMES})

    def problem(self, url: httpx.URL | str) -> str | None:
        """Why ``url`` cannot be sent through the proxy it would go through (one line,
        the proxy's credentials masked), or None."""
        url = httpx.URL(url)
        proxy = self.proxy_for(url)
        if proxy is None:
            return None
        named_by = self.named_by[url.scheme]
        shown = _masked(proxy)
        scheme = _scheme(proxy)
        if scheme in SUPPORTED_SCHEMES:
            return None
        if scheme is None:
            return f"{named_by} ({shown}) is not a proxy URL radserve can read"
        kind = "a SOCKS proxy" if scheme.startswith("socks") else f"a {scheme}:// proxy"
        return (
            f"{named_by} names {kind} ({shown}) for {url.scheme} URLs such as "
            f"{_masked(str(url))}; radserve's HTTP senders use HTTP(S) proxies only: set "
            f"{url.scheme.upper()}_PROXY to an http:// proxy, or list the receiver's host "
            "in NO_PROXY"
        )


def _scheme(proxy: str) -> str | None:
    """A proxy URL's scheme (lowercase), or None if httpx cannot read it as a URL with a
    host."""
    try:
        url = httpx.URL(proxy)
    except httpx.InvalidURL:
        return None
    return url.scheme if url.host else None


def _masked(url: str) -> str:
    """``url`` without a password or query (what a log line or refusal may show)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    user = f"{parts.username}:***@" if parts.password else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def proxy_problems(urls: Iterable[str]) -> list[str]:
    """For each of ``urls`` (the receivers a configured sender posts to) that would go
    through a proxy radserve cannot use, why: one line each, no duplicates."""
    proxies = EnvironmentProxies.read()
    problems: list[str] = []
    for url in urls:
        problem = proxies.problem(url)
        if problem is not None and problem not in problems:
            problems.append(problem)
    return problems


__all__ = ["SUPPORTED_SCHEMES", "EnvironmentProxies", "proxy_problems"]
