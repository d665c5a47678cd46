"""``radserve gateway echo|scp``: check a DICOM peer, or run the storage SCP on its own.

``echo`` exits 0 when the peer answered, 1 when it cannot be reached or did not answer
success (try again later), 2 when it rejected the association permanently (fix the AE
configuration at one end). ``scp`` runs until interrupted and prints each completed
study's folder; it reads the same ``gateway.*`` settings as ``radserve serve`` (flags
override them), and the server wires the same SCP to its intake.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.commands.params import positive_seconds
from radserve.config import ANY_HOST, TlsSettings
from radserve.gateway.completeness import CompletedStudy, LatePolicy
from radserve.gateway.config import Destination, scp_config_from_settings
from radserve.gateway.conformance import UnwantedPolicy
from radserve.gateway.scp import GatewaySCP, NotBindableError
from radserve.gateway.scu import Outcome, StoreSCU

logger = logging.getLogger(__name__)

EXIT_UNREACHABLE = 1
EXIT_REJECTED = 2


def _tls(cert: Path | None, key: Path | None, ca: Path | None) -> TlsSettings | None:
    if cert is None and key is None and ca is None:
        return None
    try:
        return TlsSettings(cert=cert, key=key, ca=ca)
    except ValidationError as exc:  # --tls-cert without --tls-key: a traceback before
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise click.UsageError(f"--tls-cert/--tls-key/--tls-ca: {reason}") from None


def _peer(text: str) -> dict[str, str]:
    """``AE`` or ``AE@host`` (host ``*`` or absent: any address) as a peer setting."""
    title, _, host = text.partition("@")
    return {"ae_title": title, "host": host or ANY_HOST}


_EXISTING = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group("gateway")
def group() -> None:
    """DICOM network gateway: C-ECHO a peer, run the storage SCP."""


@group.command("echo")
@click.option("--host", required=True, help="The peer's host name or address.")
@click.option("--port", required=True, type=click.IntRange(1, 65535))
@click.option("--ae", "ae_title", required=True, help="The peer's (called) AE title.")
@click.option("--calling-ae", default="RADSERVE", show_default=True, help="radserve's AE title.")
@click.option(
    "--timeout",
    type=positive_seconds(),
    default=10.0,
    show_default=True,
    help="Seconds per network step.",
)
@click.option("--tls-cert", type=_EXISTING, default=None, help="Client certificate (PEM).")
@click.option("--tls-key", type=_EXISTING, default=None, help="Client key (PEM).")
@click.option(
    "--tls-ca", type=_EXISTING, default=None, help="CA that signs the peer (PEM; needed for TLS)."
)
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
        name=ae_title.strip(),
        ae_title=ae_title,
        host=host,
        port=port,
        tls=_tls(tls_cert, tls_key, tls_ca),
    )
    scu = StoreSCU(
        calling_ae,
        connect_timeout_s=timeout,
        acse_timeout_s=timeout,
        dimse_timeout_s=timeout,
        network_timeout_s=timeout,
        connect_timeout_name="--timeout",
    )
    result = scu.echo(destination)
    if result.outcome is Outcome.SENT:
        click.echo(result.message)
        return
    click.echo(result.message, err=True)
    sys.exit(EXIT_REJECTED if result.outcome is Outcome.PERMANENT else EXIT_UNREACHABLE)


@group.command("scp")
@CONFIG_OPTION
@DATA_DIR_OPTION
@click.option("--host", default=None, help="Address to listen on [gateway.host].")
@click.option("--port", default=None, type=click.IntRange(0, 65535), help="[gateway.port]")
@click.option("--ae-title", default=None, help="The SCP's AE title [gateway.ae_title].")
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    metavar="AE[@HOST]",
    help="Calling AE allowed to store (repeat; replaces gateway.allowed_peers).",
)
@click.option(
    "--quiet",
    "quiet_s",
    default=None,
    type=positive_seconds(),
    help="Seconds without a new instance before a study is complete [gateway.quiet_s].",
)
@click.option(
    "--unwanted",
    type=click.Choice([p.value for p in UnwantedPolicy]),
    default=None,
    help="Non-image storage classes: keep aside, or refuse [gateway.unwanted].",
)
@click.option(
    "--late",
    type=click.Choice([p.value for p in LatePolicy]),
    default=None,
    help="Instances after a study completed: run again, or flag [gateway.late_policy].",
)
@click.option(
    "--receivers",
    type=click.IntRange(1, 64),
    default=None,
    help="Processes that receive associations behind the one port [gateway.receivers].",
)
@click.option("--tls-cert", type=_EXISTING, default=None, help="[gateway.tls.cert] (PEM)")
@click.option("--tls-key", type=_EXISTING, default=None, help="[gateway.tls.key] (PEM)")
@click.option("--tls-ca", type=_EXISTING, default=None, help="[gateway.tls.ca]: client CA.")
def scp(
    config_file: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    ae_title: str | None,
    allowed: tuple[str, ...],
    quiet_s: float | None,
    unwanted: str | None,
    late: str | None,
    receivers: int | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
) -> None:
    """Run the storage SCP until interrupted; print each completed study's folder.

    Reads the same ``gateway.*`` settings as ``radserve serve`` (config file,
    ``RADSERVE_GATEWAY__*``); each flag overrides its setting. Received instances go to
    DATA_DIR/gateway/incoming/<study>/ (quarantine/ for non-image classes)."""
    from radserve.config import load_settings

    settings = load_settings(
        config_file,
        data_dir=data_dir,
        gateway__host=host,
        gateway__port=port,
        gateway__ae_title=ae_title,
        gateway__allowed_peers=[_peer(text) for text in allowed] if allowed else None,
        gateway__quiet_s=quiet_s,
        gateway__unwanted=unwanted,
        gateway__late_policy=late,
        gateway__receivers=receivers,
        gateway__tls__cert=tls_cert,
        gateway__tls__key=tls_key,
        gateway__tls__ca=tls_ca,
    )
    config = scp_config_from_settings(settings.gateway, settings.data_dir, settings.ingest)
    server = GatewaySCP(config, _print_study)

    def _stop(*_: Any) -> None:
        # only flags: stop() runs below, in the main thread, once; a handler calling it
        # ran inside it on a second SIGTERM (``timeout`` and systemd signal the process
        # and then its group) and crashed pynetdicom's shutdown
        server.request_stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        bound_host, bound_port = server.start()
    except NotBindableError as exc:  # one line, as serve's doctor check says it
        server.stop()
        raise click.ClickException(f"dicom port: {exc}") from None
    tls = " with TLS" if server.tls else ""
    click.echo(f"listening as {config.ae_title} on {bound_host}:{bound_port}{tls}", err=True)
    try:
        server.wait()
    finally:
        server.stop()
        # stopped: a further SIGTERM must not kill the exit (Python restores the
        # default action of its handled signals as it finalizes; not of ignored ones)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _print_study(study: CompletedStudy) -> None:
    """The standalone intake: one line per completed study (the service does real intake)."""
    click.echo(
        f"study {study.study_instance_uid} {study.kind.value}: "
        f"{len(study.instances)} instances in {study.folder}"
    )
