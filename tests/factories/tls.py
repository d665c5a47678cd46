"""Certificates for TLS tests, made by the ``openssl`` command line: a test CA, a server
certificate for the loopback addresses, a client certificate it signed, and a client
certificate from a second CA that radserve does not trust."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

HAVE_OPENSSL = shutil.which("openssl") is not None
SERVER_NAMES = "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by another CA
    rogue_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], capture_output=True, check=True, timeout=60)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign",
    )  # fmt: skip
    return cert, key


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    cert, key, csr = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
    extfile = folder / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", extfile,
    )  # fmt: skip
    return cert, key


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "test-ca")
    rogue_ca = _ca(folder, "rogue-ca")
    server = _leaf(folder, "radserve", ca, SERVER_NAMES)
    client = _leaf(folder, "modality", ca, "extendedKeyUsage=clientAuth")
    rogue = _leaf(folder, "stranger", rogue_ca, "extendedKeyUsage=clientAuth")
    return Pki(ca[0], *server, *client, *rogue)


def another_client(pki: Pki, name: str) -> tuple[Path, Path]:
    """One more client certificate (subject CN ``name``) and its key, signed by ``pki``'s
    CA: a second modality."""
    ca = (pki.ca, pki.ca.with_suffix(".key"))
    return _leaf(pki.ca.parent, name, ca, "extendedKeyUsage=clientAuth")


def fingerprint(cert: Path) -> str:
    """The certificate's SHA-256 fingerprint as openssl prints it (``AB:CD:...``)."""
    done = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip().split("=", 1)[1]


def handshake(
    address: tuple[str, int], pki: Pki, *, maximum: ssl.TLSVersion, client_cert: bool = True
) -> str:
    """The TLS version a client allowing TLS 1.0 up to ``maximum`` negotiates (security
    level 0, so OpenSSL itself would speak TLS 1.0/1.1), or ``"refused: ..."``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 on purpose
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = maximum
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_verify_locations(str(pki.ca))
    if client_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    try:
        with (
            socket.create_connection(address, timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=address[0]) as tls,
        ):
            return str(tls.version())
    except (ssl.SSLError, OSError) as exc:
        return f"refused: {exc}"


def tls_1_1_is_possible_here(pki: Pki) -> bool:
    """Control for "TLS 1.1 is refused" tests: the same client does negotiate TLS 1.1
    with a server that allows it, so a refusal is the server's doing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.load_cert_chain(str(pki.server_cert), str(pki.server_key))

    def accept() -> None:
        connection, _ = listener.accept()
        try:
            with permissive.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            connection.close()

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        version = handshake(listener.getsockname(), pki, maximum=ssl.TLSVersion.TLSv1_1)
        thread.join(10)
    return version == "TLSv1.1"
