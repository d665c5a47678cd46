"""TLS contexts from :class:`radserve.config.TlsSettings`, for the DICOM gateway (SCP
and outbox SCU, PS3.15 B.1 secure transport) and the HTTPS API: one place that decides
the protocol floor (TLS 1.2) and how peers' certificates are checked."""

from __future__ import annotations

import ssl

from radserve.config import ConfigError, TlsSettings

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class TlsConfigError(ConfigError):
    """The TLS files cannot be used (missing, unreadable, key not matching the cert)."""

    code = "tls_config_invalid"


def server_context(tls: TlsSettings, what: str = "the server") -> ssl.SSLContext:
    """A server context: our certificate; with ``ca``, client certificates checked
    against it (required unless ``require_client_cert`` is false)."""
    if tls.cert is None or tls.key is None:
        raise TlsConfigError(f"TLS for {what} needs both a certificate and a key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    _load(context, tls, what)
    if tls.ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(tls: TlsSettings, what: str = "the client") -> ssl.SSLContext:
    """A client context that verifies the server against ``ca`` (host name included)
    and offers ``cert`` + ``key`` when set. Without ``ca`` there is nothing to verify
    against, so this refuses rather than connect to anyone."""
    if tls.ca is None:
        raise TlsConfigError(f"TLS for {what} needs a CA to verify the server with")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_VERSION
    _load(context, tls, what)
    return context


def _load(context: ssl.SSLContext, tls: TlsSettings, what: str) -> None:
    try:
        if tls.cert is not None:
            context.load_cert_chain(str(tls.cert), None if tls.key is None else str(tls.key))
        if tls.ca is not None:
            context.load_verify_locations(cafile=str(tls.ca))
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the TLS files for {what}: {exc}") from exc
