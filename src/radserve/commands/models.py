"""``radserve models``: what is installed, where it is deployed, install bundles, change
deployments (deploy / promote / rollback / undeploy a shadow), build precision variants.

Changes are written to the data dir's store (a row and an audit record each); a running
server reads them within ``lifecycle.poll_s``, warms the new version and then switches.
"""

from __future__ import annotations

import copy
import getpass
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from radserve.commands._console import table_console
from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.commands.params import FiniteFloatRange

if TYPE_CHECKING:
    from collections.abc import Callable

    from radserve.domain.deployment import StepDeployment
    from radserve.models.bf16 import ServingProviders
    from radserve.models.registry import ModelBundle
    from radserve.service.lifecycle import ModelLifecycle


@click.group("models")
def group() -> None:
    """Model bundles: list, install, deploy, promote, rollback, undeploy, build variants."""


def _lifecycle(
    config_file: Path | None,
    data_dir: Path | None,
    *,
    scratch: Path | None = None,
    create: bool = True,
) -> ModelLifecycle:
    """The lifecycle over the store and models a server with these settings uses; with
    ``scratch``, over an empty store in that folder instead (nothing deployed);
    ``create=False`` (a listing): no store is an error, not a new one; an older schema
    is refused either way (only ``radserve serve`` upgrades)."""
    from radserve.config import load_settings
    from radserve.ingest import IngestPolicy
    from radserve.service.catalog import Catalog
    from radserve.service.lifecycle import ModelLifecycle
    from radserve.store.audited import open_audited
    from radserve.store.store import init_store

    settings = load_settings(config_file, data_dir=data_dir)
    if scratch is None:
        store, _trail = open_audited(settings, create=create)
    else:
        store = init_store(f"sqlite:///{scratch / 'listing.db'}")
    catalog = Catalog.from_settings(settings)
    return ModelLifecycle(
        settings,
        store=store,
        catalog=catalog,
        scheduler=None,
        policy=IngestPolicy.from_settings(settings.ingest),
        results_root=settings.data_dir / "results",
    )


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"[:64]
    except (KeyError, OSError):
        return "cli"


def _print_deployment(saved: Any) -> None:
    canary = f", canary {saved.canary} {saved.canary_percent:g}%" if saved.canary else ""
    shadow = f", shadow {saved.shadow} {saved.shadow_percent:g}%" if saved.shadow else ""
    click.echo(f"{saved.step}: stable {saved.stable}{canary}{shadow} ({saved.action.value})")


def _change(
    config_file: Path | None,
    data_dir: Path | None,
    change: Callable[[ModelLifecycle], StepDeployment],
) -> None:
    """Make one deployment change on the store these settings name, then print its row."""
    lifecycle = _lifecycle(config_file, data_dir)
    try:
        saved = change(lifecycle)
    finally:
        lifecycle.store.close()
    _print_deployment(saved)


def _status(lifecycle: ModelLifecycle, models_dir: tuple[Path, ...]) -> list[dict[str, Any]]:
    """``lifecycle.status()`` with ``models_dir`` searched first; closes its store."""
    try:
        if models_dir:
            from radserve.models.registry import ModelRegistry

            registry = lifecycle.catalog.registry
            lifecycle.catalog.registry = ModelRegistry(
                [*models_dir, *registry.roots],
                missing_ok=registry.missing_ok,
                serving=registry.serving,  # bf16 judged on the server's providers
            )
        lifecycle.refresh()
        return lifecycle.status()
    finally:
        lifecycle.store.close()


@group.command("list")
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    multiple=True,
    help="Extra bundle roots, searched before the installed and bundled models.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def list_models(
    models_dir: tuple[Path, ...], as_json: bool, config_file: Path | None, data_dir: Path | None
) -> None:
    """Every version: its labels, servable precisions, gate state, where it is deployed."""
    import tempfile

    from radserve.config import load_settings
    from radserve.store.audited import missing_data

    missing = missing_data(load_settings(config_file, data_dir=data_dir))
    if missing is None:
        rows = _status(_lifecycle(config_file, data_dir, create=False), models_dir)
    else:  # the wrong folder, or before the first serve: list the bundles, write nothing
        click.echo(
            f"note: {missing}: no stored deployment (each step shows its pipeline's "
            "version as stable); nothing was written",
            err=True,
        )
        with tempfile.TemporaryDirectory(prefix="radserve-models-list-") as scratch:
            rows = _status(_lifecycle(config_file, data_dir, scratch=Path(scratch)), models_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="Model versions")
    columns = ("model", "version", "task", "labels", "deployed", "servable", "gate", "installed")
    for column in columns:
        table.add_column(column)
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], row["version"], "", "", "", "", row["error"], "")
            continue
        deployed = ", ".join(row["deployed"])
        if row["canary_percent"] is not None:
            deployed += f" ({row['canary_percent']:g}%)"
        gate = "\n".join(f"{p}: {why}" for p, why in row["gate"].items())
        table.add_row(
            row["name"],
            row["version"],
            row["task"],
            ", ".join(f"{label['value']} {label['name']}" for label in row["labels"]),
            deployed,
            ", ".join(row["servable"]),
            gate,
            "yes" if row["installed"] else "shipped/site",
        )
    table_console().print(table)


@group.command("install")
@click.argument("bundle", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--build-variants",
    is_flag=True,
    help="Build and gate precision variants (fp16/int8[/bf16]) before installing.",
)
@click.option(
    "--precision",
    "precision_text",
    default=None,
    help="Variants to build, comma-separated [default: lifecycle.variants.precisions, "
    "else fp16,int8 and bf16 where this host runs it].",
)
@click.option("--seeds", default=None, help="Held-out phantom seeds for the gate.")
@click.option("--calibration-seeds", default=None, help="Phantom seeds for INT8 calibration.")
@click.option("--small/--full-size", "small", default=None, help="Phantom size for the gate.")
@click.option(
    "--trust-gate",
    is_flag=True,
    help="Serve the variants on the bundle's own gate.json: only for a gate this site "
    "built (`radserve models build-variants` before installing). Without it a shipped "
    "gate.json is set aside (gate.shipped.json) and no variant serves until gated here.",
)
@CONFIG_OPTION
@DATA_DIR_OPTION
def install(
    bundle: Path,
    build_variants: bool,
    precision_text: str | None,
    seeds: str | None,
    calibration_seeds: str | None,
    small: bool | None,
    trust_gate: bool,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Validate BUNDLE (a folder or a zip) and install it into the data dir."""
    from radserve.lifecycle.install import remove_interrupted_installs
    from radserve.service.variant_install import VariantRequest, variant_gates

    if trust_gate and build_variants:
        raise click.UsageError(
            "--trust-gate is for a bundle installed as gated; --build-variants gates it here"
        )
    variants = None
    if build_variants:
        from radserve.commands.evaluate import parse_precisions

        precisions = parse_precisions(precision_text)[1:] if precision_text else None
        variants = VariantRequest(
            precisions=tuple(precisions) if precisions else None,
            seeds=seeds,
            calibration_seeds=calibration_seeds,
            small=small,
        )
    elif any(v is not None for v in (precision_text, seeds, calibration_seeds, small)):
        raise click.UsageError(
            "--precision, --seeds, --calibration-seeds, --small: only with --build-variants"
        )
    lifecycle = _lifecycle(config_file, data_dir)
    remove_interrupted_installs(lifecycle.settings.data_dir)
    try:
        installed = lifecycle.install(
            bundle, actor=_actor(), variants=variants, trust_shipped_gate=trust_gate
        )
    finally:
        lifecycle.store.close()
    click.echo(
        f"installed {installed.name} {installed.version} ({len(installed.files)} files, "
        f"sha256 recorded) in {installed.directory}"
    )
    serving = lifecycle.catalog.registry.serving  # "servable here" as models list says it
    if installed.shipped_gate == "set_aside":
        _print_untrusted_gate(installed.directory, serving, rebuilt=variants is not None)
    _print_servable(installed.directory, serving, variant_gates(installed.directory))


# what `models install` and `models installs` say of a gate.json set aside at install
SHIPPED_GATE_NOTE = (
    "the bundle's gate.json was measured elsewhere and is not trusted (kept as gate.shipped.json)"
)


def _installed_bundle(directory: Path, serving: ServingProviders | None) -> ModelBundle:
    """The installed version in ``directory``, judged on ``serving`` (the server's)."""
    from radserve.models.registry import ModelRegistry

    registry = ModelRegistry([directory.parent.parent], serving=serving)
    return registry.get(directory.parent.name, directory.name)


def _print_untrusted_gate(
    directory: Path, serving: ServingProviders | None, *, rebuilt: bool
) -> None:
    """Say that the bundle's own gate.json was not trusted, and which variants that
    leaves without a gate (none when ``--build-variants`` gated them all here)."""
    from radserve.service.variant_install import variant_gates

    bundle = _installed_bundle(directory, serving)
    gated = variant_gates(directory)
    ungated = [p for p in bundle.spec.files if p != "fp32" and p not in gated]
    click.echo(
        f"  {SHIPPED_GATE_NOTE}"
        + ("; the variants were gated here instead" if rebuilt and not ungated else "")
    )
    for precision in ungated:
        click.echo(f"  {precision}: not servable: {bundle.rejection(precision)}")


def _print_servable(
    directory: Path, serving: ServingProviders | None, gates: dict[str, dict[str, object]]
) -> None:
    """Each variant's gate verdict and whether THIS host may serve it, by the rule `models
    list` shows (``ModelBundle.rejection``, on the server's providers): a gate accepted on
    an AMX CPU said "accepted" on an AVX2 host that refuses bf16 and that gate's int8."""
    bundle = _installed_bundle(directory, serving)
    for precision, gate in gates.items():
        reasons = "".join(f"; {r}" for r in gate["reasons"])  # type: ignore[attr-defined]
        if not gate["accepted"]:
            click.echo(f"  {precision}: REJECTED by its gate (not deployable){reasons}")
            continue
        why = bundle.rejection(precision)
        here = "servable here" if why is None else f"not servable here: {why}"
        click.echo(f"  {precision}: accepted by its gate{reasons}; {here}")


@group.command("installs")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def installs(as_json: bool, config_file: Path | None, data_dir: Path | None) -> None:
    """Installs the server ran after answering (``POST /v1/models?build_variants=true``),
    newest first: queued, building, installed, rejected (why), failed, interrupted."""
    from radserve.config import load_settings
    from radserve.lifecycle.install_tasks import InstallTasks

    tasks = InstallTasks(load_settings(config_file, data_dir=data_dir).data_dir).recent()
    if as_json:
        click.echo(json.dumps([t.as_json() for t in tasks], indent=2))
        return
    table = Table(title="Installs run after their request")
    for column in ("id", "state", "bundle", "created", "finished", "outcome"):
        table.add_column(column)
    for task in tasks:
        if task.result is not None:
            outcome = f"{task.result['name']} {task.result['version']}" + "".join(
                f"; {precision} {'accepted' if gate['accepted'] else 'REJECTED'}"
                for precision, gate in task.result["variants"].items()
            )
            if task.result.get("shipped_gate") == "set_aside":
                outcome += f"; {SHIPPED_GATE_NOTE}"
        elif task.error:
            outcome = task.error["message"]
        else:
            outcome = "waits for the next server start" if task.left_behind else ""
        table.add_row(task.id, task.state, task.source, task.created, task.finished or "", outcome)
    table_console().print(table)


@group.command("deploy")
@click.argument("step")
@click.argument("version")
@click.option(
    "--role", type=click.Choice(["stable", "canary", "shadow"]), default="stable", show_default=True
)
@click.option("--percent", type=FiniteFloatRange(0, 100), default=0.0, help="Canary/shadow share.")
@click.option("--include-urgent", is_flag=True, help="Canary: route URGENT studies too.")
@click.option("--reason", required=True, help="Why (audited).")
@CONFIG_OPTION
@DATA_DIR_OPTION
def deploy(
    step: str,
    version: str,
    role: str,
    percent: float,
    include_urgent: bool,
    reason: str,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Deploy VERSION of model STEP as stable, canary or shadow."""
    from radserve.domain.deployment import Role
    from radserve.lifecycle.deploy_options import check_deploy_options

    check_deploy_options(step, version, Role(role), percent, include_urgent)
    _change(
        config_file,
        data_dir,
        lambda lifecycle: lifecycle.deploy(
            step,
            version,
            role=Role(role),
            percent=percent,
            include_urgent=include_urgent,
            actor=_actor(),
            reason=reason,
        ),
    )


@group.command("promote")
@click.argument("step")
@click.option("--reason", required=True, help="Why (audited).")
@CONFIG_OPTION
@DATA_DIR_OPTION
def promote(step: str, reason: str, config_file: Path | None, data_dir: Path | None) -> None:
    """Make STEP's canary its stable version."""
    _change(config_file, data_dir, lambda lc: lc.promote(step, actor=_actor(), reason=reason))


@group.command("rollback")
@click.argument("step")
@click.option("--reason", required=True, help="Why (audited).")
@CONFIG_OPTION
@DATA_DIR_OPTION
def rollback(step: str, reason: str, config_file: Path | None, data_dir: Path | None) -> None:
    """Drop STEP's canary, or go back to its previous stable version."""
    _change(config_file, data_dir, lambda lc: lc.rollback(step, actor=_actor(), reason=reason))


@group.command("undeploy")
@click.argument("step")
@click.option(
    "--role",
    type=click.Choice(["shadow"]),
    required=True,
    help="The role to remove (a canary is dropped by rollback).",
)
@click.option("--reason", default=None, help="Why (audited).")
@CONFIG_OPTION
@DATA_DIR_OPTION
def undeploy(
    step: str, role: str, reason: str | None, config_file: Path | None, data_dir: Path | None
) -> None:
    """Stop STEP's shadow: no study is sampled for it; stable and canary stay."""
    _change(
        config_file,
        data_dir,
        lambda lc: lc.undeploy_shadow(step, actor=_actor(), reason=reason),
    )


@group.group("import")
def import_group() -> None:
    """Import a model trained with another framework as a radserve bundle."""


_channel_option = click.option(
    "--channel",
    "channels",
    multiple=True,
    metavar="INDEX=MODALITY[:REGEX]",
    help=(
        "The series input channel INDEX is read from, where its name (nnU-Net's "
        "dataset.json channel_names, a MONAI Bundle's channel_def or loader key) does not "
        "say: a DICOM Modality (PT: a PET in SUVbw) and optionally a regular expression the "
        "Series Description must match, e.g. 1=PT or 2=MR:(?i)flair. Repeatable."
    ),
)


def serving_providers(config_file: Path | None) -> tuple[str, ...]:
    """The execution providers a server with these settings (``config_file``, default
    ``$RADSERVE_CONFIG``) serves with (its catalog's
    :attr:`~radserve.service.catalog.Catalog.serving_providers`: ``runtime.providers``,
    else the host's choice), which an import checks and probes its export on and
    ``models build-variants`` builds, evaluates and times the variants on. Before
    2026-12-07 both took the host's choice whatever the settings said: a network OpenVINO
    cannot compile was refused for a server serving on the CPU provider, and that server
    got variants gated through OpenVINO and a bf16 variant it cannot serve.

    Raises:
        click.ClickException: the settings do not load, or name providers this host
            cannot run (what ``radserve serve`` would refuse to start with).
    """
    from radserve.config import load_settings
    from radserve.errors import RadserveError
    from radserve.service.catalog import Catalog

    try:
        return Catalog.from_settings(load_settings(config_file)).serving_providers
    except RadserveError as exc:
        raise click.ClickException(exc.message) from exc


def _echo_imported(folder: Path, out: Path) -> None:
    """Say where the bundle went; for a model of several series, the pipeline selection
    that picks its reference series (the series the other channels are placed on)."""
    from radserve.models.manifest import load_manifest

    click.echo(f"imported {folder} -> {out}")
    reference = load_manifest(out / "model.yaml").input.reference_channel
    if reference is not None:
        rule: dict[str, Any] = {"modalities": [reference.modality]}
        if reference.series_description:
            rule["series_description"] = reference.series_description
        click.echo(
            f"its reference channel {reference.name!r}: select that series in the pipeline "
            f"with series_selection: {json.dumps(rule)}"
        )


@import_group.command("nnunet")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Bundle root to write <name>/<version>/ into (pass it to run/serve as --models-dir).",
)
@click.option("--name", default=None, help="Bundle name (default: the dataset name).")
@click.option("--version", "version", default="1.0.0", show_default=True)
@click.option(
    "--fold", "folds", multiple=True, help="Folds to ensemble: 0-4 or all (default: all found)."
)
@click.option(
    "--checkpoint",
    default="checkpoint_final.pth",
    show_default=True,
    help="Checkpoint file in each fold folder (nnU-Net's -chk), e.g. checkpoint_best.pth.",
)
@click.option(
    "--tta/--no-tta",
    default=False,
    show_default=True,
    help="Bake mirroring test-time augmentation into the graph (2^axes passes per patch).",
)
@_channel_option
@CONFIG_OPTION
def import_nnunet_command(
    folder: Path,
    models_dir: Path,
    name: str | None,
    version: str,
    folds: tuple[str, ...],
    checkpoint: str,
    tta: bool,
    channels: tuple[str, ...],
    config_file: Path | None,
) -> None:
    """FOLDER: an nnU-Net v2 trainer folder (<Trainer>__<Plans>__<configuration>)."""
    from radserve.importers import ImportRefusedError
    from radserve.importers.channel_series import parse_channel_option
    from radserve.importers.nnunet import import_nnunet

    providers = serving_providers(config_file)
    try:
        rules = dict(parse_channel_option(c) for c in channels)
        out = import_nnunet(
            folder,
            models_dir,
            name=name,
            version=version,
            folds=folds or None,
            checkpoint=checkpoint,
            tta=tta,
            channels=rules or None,
            providers=providers,
        )
    except ImportRefusedError as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_imported(folder, out)


@import_group.command("monai-bundle")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Bundle root to write <name>/<version>/ into (pass it to run/serve as --models-dir).",
)
@click.option("--name", default=None, help="Bundle name (default: metadata.json's name).")
@click.option("--version", "version", default="1.0.0", show_default=True)
@_channel_option
@click.option(
    "--trust-torchscript",
    is_flag=True,
    help="Import a models/model.ts (TorchScript runs the code it holds: only from a source "
    "you trust). Without it a bundle with no model.pt is refused.",
)
@CONFIG_OPTION
def import_monai_command(
    folder: Path,
    models_dir: Path,
    name: str | None,
    version: str,
    channels: tuple[str, ...],
    trust_torchscript: bool,
    config_file: Path | None,
) -> None:
    """FOLDER: a MONAI Bundle (configs/inference.json, configs/metadata.json, models/model.pt)."""
    from radserve.importers import ImportRefusedError
    from radserve.importers.channel_series import parse_channel_option
    from radserve.importers.monai_bundle import import_monai

    providers = serving_providers(config_file)
    try:
        rules = dict(parse_channel_option(c) for c in channels)
        out = import_monai(
            folder,
            models_dir,
            name=name,
            version=version,
            channels=rules or None,
            trust_torchscript=trust_torchscript,
            providers=providers,
        )
    except ImportRefusedError as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_imported(folder, out)


def _add_monai_alias() -> None:
    """``import monai``: the first name of ``import monai-bundle``, kept so scripts still run."""
    alias = copy.copy(import_monai_command)
    alias.hidden = True
    alias.help = "Alias of monai-bundle."
    import_group.add_command(alias, "monai")


_add_monai_alias()


def _add_variant_commands() -> None:
    from radserve.commands import variants

    group.add_command(variants.command)


_add_variant_commands()
