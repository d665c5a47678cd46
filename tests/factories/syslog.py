"""A syslog collector for tests: radserve's own (:mod:`radserve.bench.syslog_collector`,
which the critical bench runs against too). RFC 5425 over TLS (certificate given) or
RFC 6587 octet counting over plain TCP, on a loopback port; each octet-counted frame is
a message. ``close()`` and a new ``Collector`` on the same port make it go down and come
back, as a restarted collector does."""

from __future__ import annotations

from radserve.bench.syslog_collector import HEADER, Collector, make_certificate

__all__ = ["HEADER", "Collector", "make_certificate"]
