"""``radserve gateway echo|scp``: check a DICOM peer, or run the storage SCP on its own.

``echo`` exits 0 when the peer answered, 1 when it cannot be reached or did not answer
success (try again later), 2 when it rejected the association permanently (fix the AE
configuration at one end). ``scp`` runs until interrupted and prints each completed
study's folder; the server wires the same SCP to its intake.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click

from radserve.gateway.completeness import CompletedStudy, LatePolicy
from radserve.gateway.config import ANY_HOST, Destination, Peer, ScpConfig, TlsConfig
from radserve.gateway.conformance import UnwantedPolicy
from radserve.gateway.scp import GatewaySCP
from radserve.gateway.scu import Outcome, StoreSCU

logger = logging.getLogger(__name__)

EXIT_UNREACHABLE = 1
EXIT_REJECTED = 2


def _tls(cert: Path | None, key: Path | None, ca: Path | None) -> TlsConfig | None:
    if cert is None and key is None and ca is None:
        return None
    return TlsConfig(cert=cert, key=key, ca=ca)


def _peer(text: str) -> Peer:
    """``AE`` or ``AE@host`` (host ``*`` or absent: any address)."""
    title, _, host = text.partition("@")
    return Peer(ae_title=title, host=host or ANY_HOST)


_EXISTING = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group("gateway")
def group() -> None:
    """DICOM network gateway: C-ECHO a peer, run the storage SCP."""


@group.command("echo")
@click.option("--host", required=True, help="The peer's host name or address.")
@click.option("--port", required=True, type=click.IntRange(1, 65535))
@click.option("--ae", "ae_title", required=True, help="The peer's (called) AE title.")
@click.option("--calling-ae", default="RADSERVE", show_default=True, help="radserve's AE title.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per network step.")
@click.option("--tls-cert", type=_EXISTING, default=None, help="Client certificate (PEM).")
@click.option("--tls-key", type=_EXISTING, default=None, help="Client key (PEM).")
@click.option("--tls-ca", type=_EXISTING, default=None, help="CA that signs the peer (PEM).")
def echo(
    host: str,
    port: int,
    ae_title: str,
    calling_ae: str,
    timeout: float,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
) -> None:
    """C-ECHO the peer; the exit status tells whether it answered."""
    destination = Destination(
        name="echo", ae_title=ae_title, host=host, port=port, tls=_tls(tls_cert, tls_key, tls_ca)
    )
    scu = StoreSCU(
        calling_ae,
        connect_timeout_s=timeout,
        acse_timeout_s=timeout,
        dimse_timeout_s=timeout,
        network_timeout_s=timeout,
    )
    result = scu.echo(destination)
    if result.outcome is Outcome.SENT:
        click.echo(result.message)
        return
    click.echo(result.message, err=True)
    sys.exit(EXIT_REJECTED if result.outcome is Outcome.PERMANENT else EXIT_UNREACHABLE)


@group.command("scp")
@click.option("--port", default=11112, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ae-title", default="RADSERVE", show_default=True)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Received instances go to DATA_DIR/incoming/<study>/ (quarantine/ for others).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    metavar="AE[@HOST]",
    help="Calling AE allowed to store (repeat). None given: any AE is accepted.",
)
@click.option(
    "--quiet",
    "quiet_s",
    default=10.0,
    show_default=True,
    help="Seconds without a new instance before a study is complete.",
)
@click.option(
    "--unwanted",
    type=click.Choice([p.value for p in UnwantedPolicy]),
    default=UnwantedPolicy.QUARANTINE.value,
    show_default=True,
    help="Non-image storage classes: keep aside, or refuse at association.",
)
@click.option(
    "--late",
    type=click.Choice([p.value for p in LatePolicy]),
    default=LatePolicy.RERUN.value,
    show_default=True,
    help="Instances after a study completed: hand it over again, or flag it.",
)
@click.option("--tls-cert", type=_EXISTING, default=None, help="Server certificate (PEM).")
@click.option("--tls-key", type=_EXISTING, default=None, help="Server key (PEM).")
@click.option("--tls-ca", type=_EXISTING, default=None, help="Require client certs from this CA.")
def scp(
    port: int,
    ae_title: str,
    data_dir: Path,
    host: str,
    allowed: tuple[str, ...],
    quiet_s: float,
    unwanted: str,
    late: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
) -> None:
    """Run the storage SCP until interrupted; print each completed study's folder."""
    config = ScpConfig(
        data_dir=data_dir,
        ae_title=ae_title,
        host=host,
        port=port,
        allowed_peers=tuple(_peer(text) for text in allowed),
        quiet_s=quiet_s,
        unwanted=UnwantedPolicy(unwanted),
        late_policy=LatePolicy(late),
        tls=_tls(tls_cert, tls_key, tls_ca),
    )
    server = GatewaySCP(config, _print_study)

    def _stop(*_: Any) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    bound_host, bound_port = server.start()
    click.echo(f"listening as {config.ae_title} on {bound_host}:{bound_port}", err=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()


def _print_study(study: CompletedStudy) -> None:
    """The standalone intake: one line per completed study (the service does real intake)."""
    click.echo(
        f"study {study.study_instance_uid} {study.kind.value}: "
        f"{len(study.instances)} instances in {study.folder}"
    )
