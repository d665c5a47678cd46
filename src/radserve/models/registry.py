"""Find model bundles on disk and hand out only the files that may serve.

A bundle is ``<root>/<name>/<version>/model.yaml`` plus the ONNX files its ``files``
names. Several roots may be given (a site's own folder first, then the bundled
``radserve/assets/models``); when two roots hold the same name and version the earlier
root wins. ``get(name)`` without a version picks the highest semantic version.

FP32 always serves. A reduced-precision file (``fp16``, ``int8``) serves only when the
bundle's ``gate.json`` records it as accepted and the SHA-256 of both it and the FP32
file still match what was gated; otherwise :class:`~radserve.errors.VariantRejectedError`
says why.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import get_args

from radserve.errors import ModelError, UnknownModelError, VariantRejectedError
from radserve.host import cpu_kernel, kernel_family
from radserve.models.bf16 import ServingProviders
from radserve.models.gate import (
    CPU_PROVIDERS,
    GATE_FILE,
    SHIPPED_GATE_FILE,
    GateReport,
    VariantGate,
    file_sha256,
    read_gate_report,
)
from radserve.models.manifest import ModelSpec, Precision, load_manifest

logger = logging.getLogger(__name__)

__all__ = ["BundleInfo", "ModelBundle", "ModelRegistry", "bundled_model_dir", "version_key"]

MANIFEST = "model.yaml"
PRECISIONS: tuple[str, ...] = get_args(Precision)
_BUILD_HINT = "build and gate it with `radserve models build-variants --model {name}`"
_SEMVER = re.compile(
    r"^v?(?P<major>\d+)(?:\.(?P<minor>\d+))?(?:\.(?P<patch>\d+))?"
    r"(?:-(?P<pre>[0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)


def _stat_key(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns)


def bundled_model_dir() -> Path:
    """The models shipped inside the package."""
    return Path(str(resources.files("radserve") / "assets" / "models"))


def version_key(version: str) -> tuple[object, ...]:
    """Sort key for versions: semantic versions by number (a pre-release sorts before its
    release, ``1.10.0`` after ``1.9.0``); anything else sorts below them, by text."""
    match = _SEMVER.match(version)
    if not match:
        return (0, version)
    numbers = tuple(int(match.group(k) or 0) for k in ("major", "minor", "patch"))
    pre = match.group("pre")
    if pre is None:
        release: tuple[object, ...] = (1,)
    else:
        release = (
            0,
            tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")),
        )
    return (1, numbers, release)


@dataclass(frozen=True)
class BundleInfo:
    """What ``list()`` reports about one bundle."""

    name: str
    version: str
    task: str
    directory: Path
    declared: tuple[str, ...]
    servable: tuple[str, ...]
    description: str = ""


class ModelBundle:
    """One bundle folder and its parsed ``model.yaml``."""

    def __init__(
        self,
        spec: ModelSpec,
        directory: Path,
        *,
        allow_ungated: bool = False,
        serving: ServingProviders | None = None,
    ) -> None:
        self.spec = spec
        self.directory = Path(directory)
        self._allow_ungated = allow_ungated
        # what the server serves with (its registry's); None: a tool's registry, which
        # judges bf16 by this CPU's kernels only
        self._serving = serving
        # Keyed by the file's (size, mtime): a file replaced on disk is hashed again.
        self._hashes: dict[str, tuple[tuple[int, int], str]] = {}
        self._gate: tuple[tuple[int, int] | None, GateReport | None] | None = None
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"ModelBundle({self.spec.key!r}, {str(self.directory)!r})"

    @property
    def key(self) -> str:
        return self.spec.key

    def gate_report(self) -> GateReport | None:
        """The bundle's parsed ``gate.json``, ``None`` when there is none (re-read when
        the file changes)."""
        key = _stat_key(self.directory / GATE_FILE)
        if self._gate is None or self._gate[0] != key:
            self._gate = (key, read_gate_report(self.directory) if key else None)
        return self._gate[1]

    def candidate_path(self, precision: str) -> Path:
        """The declared file for ``precision``, gated or not. For the variant builder and
        the gate only; serving code calls :meth:`onnx_path`."""
        if precision not in PRECISIONS:
            hint = difflib.get_close_matches(precision, PRECISIONS, n=1)
            suffix = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ModelError(
                f"unknown precision {precision!r} (expected one of {', '.join(PRECISIONS)}){suffix}"
            )
        filename = self.spec.files.get(precision)  # type: ignore[call-overload]
        if filename is None:
            raise VariantRejectedError(
                f"{self.key} has no {precision} file in {self.directory / MANIFEST} "
                f"(declared: {', '.join(self.spec.files)}); "
                + _BUILD_HINT.format(name=self.spec.name)
            )
        path = self.directory / filename
        if not path.is_file():
            raise ModelError(
                f"{self.key}: {precision} file {path} named in model.yaml does not exist; "
                "restore the bundle or fix `files` in model.yaml"
            )
        return path

    def sha256(self, precision: str) -> str:
        """Hex SHA-256 of the declared file for ``precision`` (cached until it changes)."""
        path = self.candidate_path(precision)
        key = _stat_key(path)
        cached = self._hashes.get(precision)
        if cached is None or cached[0] != key:
            cached = (key or (0, 0), file_sha256(path))
            self._hashes[precision] = cached
        return cached[1]

    def rejection(self, precision: str) -> str | None:
        """Why ``precision`` may not serve, or ``None`` when it may: its file, its gate,
        and whether this host and server run it (bf16 by the providers the server serves
        with, where the registry knows them: :mod:`radserve.models.bf16`)."""
        try:
            path = self.candidate_path(precision)
        except ModelError as exc:
            return exc.message
        if precision == "fp32":
            return None
        try:
            report = self.gate_report()
        except ModelError as exc:
            return exc.message
        if report is None and (self.directory / SHIPPED_GATE_FILE).is_file():
            return (
                f"{self.key} {precision}: the gate.json that came with the bundle is not "
                f"trusted (kept as {SHIPPED_GATE_FILE}): it was measured elsewhere, not on "
                "this site's held-out phantoms or studies; gate it here: install the bundle "
                "with --build-variants, or gate it with `radserve models build-variants` "
                "before installing and install with --trust-gate"
            )
        if report is None:
            return (
                f"{self.key} {precision} has no gate report ({self.directory / GATE_FILE} "
                "is missing); " + _BUILD_HINT.format(name=self.spec.name)
            )
        record = report.variants.get(precision)
        if record is None:
            return f"{self.key} {precision} is not in gate.json; " + _BUILD_HINT.format(
                name=self.spec.name
            )
        if not record.accepted:
            why = "; ".join(record.reasons) or "no reason recorded"
            return f"{self.key} {precision} was rejected by its accuracy gate: {why}"
        if report.fp32_sha256 != self.sha256("fp32"):
            return (
                f"{self.key} {precision} was gated against another fp32 model (the fp32 "
                "file changed since); " + _BUILD_HINT.format(name=self.spec.name)
            )
        if record.file != path.name or record.sha256 != self.sha256(precision):
            return (
                f"{self.key} {precision} file {path.name} changed since it was gated "
                f"(gate.json records {record.file} sha256 {record.sha256[:12]}...); "
                + _BUILD_HINT.format(name=self.spec.name)
            )
        if precision == "bf16" and self._serving is not None:
            why = self._serving.bf16_refusal()  # the rule requires.precision meets too
            if why is not None:
                return f"{self.key} bf16 may not serve here: bf16 {why}"
        return self._other_cpu(precision, record)

    def _other_cpu(self, precision: str, record: VariantGate) -> str | None:
        """Why a gate measured through a CPU provider does not hold for this CPU: its
        kernels for ``precision`` compute other numbers (:func:`radserve.host.kernel_family`).
        A variant gated on a GPU is left to :meth:`gate_coverage`; a record naming no
        provider is an older CPU gate (`build-variants` gates on the CPU)."""
        if record.providers and not any(p in CPU_PROVIDERS for p in record.providers):
            return None
        here = cpu_kernel(precision)
        gated = record.cpu_kernel
        if gated is None and precision == "fp16":
            gated = "float32"  # gated before kernels were recorded: no CPU then had fp16
        if gated is not None and kernel_family(gated) == kernel_family(here):
            return None
        then = (
            f"on a CPU computing it with {gated} ({kernel_family(gated)})"
            if gated is not None
            else "before radserve recorded which CPU kernels it measured"
        )
        now = f"{here} ({kernel_family(here)})" if here is not None else kernel_family(here)
        return (
            f"{self.key} {precision} was gated {then}, and this CPU computes it with "
            f"{now}: numbers that gate did not measure; gate it on this host with "
            f"`radserve models build-variants --model {self.spec.name}`, or serve fp32"
        )

    def gate_coverage(self, precision: str, provider: str) -> str | None:
        """Why the accuracy gate of ``precision`` does not cover ``provider`` (a warning
        for the report), or ``None`` when it does or nothing says otherwise.

        A reduced-precision file is computed differently by each provider (OpenVINO's
        INT8 kernels are not the CPU provider's, bf16 exists only in OpenVINO), so its
        gate speaks for the providers it was evaluated through. Serving it elsewhere is
        allowed (a GPU site may trust a CPU gate) but said in every report.
        """
        if precision == "fp32":
            return None
        try:
            report = self.gate_report()
        except ModelError:
            return None
        record = report.variants.get(precision) if report else None
        if record is None or not record.providers or provider in record.providers:
            return None
        return (
            f"{self.key} {precision} was gated through {', '.join(record.providers)} and "
            f"ran on {provider}, which its accuracy gate does not cover; run `radserve "
            f"models build-variants {self.spec.name}` on this host to gate it here"
        )

    def onnx_path(self, precision: str = "fp32") -> Path:
        """The file to serve at ``precision``; a variant only if its gate passed.

        Raises:
            VariantRejectedError: the variant is not built, has no gate report, failed
                its gate, or changed since it was gated.
            ModelError: unknown precision, or a declared file is missing.
        """
        path = self.candidate_path(precision)
        why = self.rejection(precision)
        if why is None:
            return path
        if self._allow_ungated:
            if precision not in self._warned:
                self._warned.add(precision)
                logger.warning("using an ungated variant (gate evaluation only): %s", why)
            return path
        raise VariantRejectedError(why)

    def available_precisions(self) -> list[str]:
        """Precisions that may serve: fp32 and every variant whose gate passed."""
        return [p for p in PRECISIONS if p in self.spec.files and self.rejection(p) is None]

    def info(self) -> BundleInfo:
        return BundleInfo(
            name=self.spec.name,
            version=self.spec.version,
            task=self.spec.task,
            directory=self.directory,
            declared=tuple(self.spec.files),
            servable=tuple(self.available_precisions()),
            description=self.spec.description,
        )


class ModelRegistry:
    """Bundles found under one or more roots (default: the bundled models).

    ``allow_ungated=True`` makes every bundle's :meth:`ModelBundle.onnx_path` return
    declared variants that have not (yet) passed their gate; only the variant builder
    uses it, to evaluate candidates before gating them. A root in ``missing_ok`` (the
    data folder's install root, made by the first install) may be absent without a
    warning: a new server's every command warned that it did not exist.

    ``serving``: what the server this registry serves for serves with (its catalog's,
    :meth:`radserve.service.catalog.Catalog.from_settings`), by which each bundle judges
    whether bf16 may serve (:meth:`ModelBundle.rejection`); ``None`` (a tool's registry:
    evaluation, a variant build, a benchmark) judges it by this CPU alone.
    """

    def __init__(
        self,
        roots: Path | str | Sequence[Path | str] | None = None,
        *,
        allow_ungated: bool = False,
        missing_ok: Sequence[Path] = (),
        serving: ServingProviders | None = None,
    ) -> None:
        if roots is None:
            roots = [bundled_model_dir()]
        elif isinstance(roots, str | Path):
            roots = [roots]
        self.roots = tuple(Path(r) for r in roots)
        self.allow_ungated = allow_ungated
        self.missing_ok = tuple(Path(r) for r in missing_ok)
        self.serving = serving
        self._found: dict[str, dict[str, Path]] | None = None
        # directory -> (model.yaml's (size, mtime), bundle): an edited manifest is re-read
        self._bundles: dict[Path, tuple[tuple[int, int] | None, ModelBundle]] = {}

    def _scan(self) -> dict[str, dict[str, Path]]:
        """name -> version -> bundle directory, earlier roots first."""
        if self._found is None:
            found: dict[str, dict[str, Path]] = {}
            for root in self.roots:
                if not root.is_dir():
                    log = logger.debug if root in self.missing_ok else logger.warning
                    log("model root %s does not exist; skipped", root)
                    continue
                for manifest in sorted(root.glob(f"*/*/{MANIFEST}")):
                    directory = manifest.parent
                    name, version = directory.parent.name, directory.name
                    versions = found.setdefault(name, {})
                    if version in versions:
                        logger.info(
                            "%s/%s in %s shadowed by %s", name, version, root, versions[version]
                        )
                        continue
                    versions[version] = directory
            self._found = found
        return self._found

    def rescan(self) -> None:
        """Look at the roots again on next use (a bundle was installed)."""
        self._found = None

    def names(self) -> list[str]:
        return sorted(self._scan())

    def versions(self, name: str) -> list[str]:
        """Versions of ``name``, oldest first."""
        return sorted(self._scan().get(name, {}), key=version_key)

    def _available(self) -> str:
        items = [f"{n} ({', '.join(self.versions(n))})" for n in self.names()]
        roots = ", ".join(str(r) for r in self.roots)
        return ", ".join(items) if items else f"none (searched {roots})"

    def get(self, name: str, version: str | None = None) -> ModelBundle:
        """The bundle ``name`` at ``version`` (default: the latest semantic version)."""
        found = self._scan()
        if name not in found:
            hint = difflib.get_close_matches(name, list(found), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else "."
            raise UnknownModelError(
                f"unknown model {name!r}{suggestion} Available: {self._available()}"
            )
        if version is None:
            version = self.versions(name)[-1]
        elif version not in found[name]:
            hint = difflib.get_close_matches(version, list(found[name]), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else "."
            raise UnknownModelError(
                f"model {name!r} has no version {version!r}{suggestion} "
                f"Available versions: {', '.join(self.versions(name))}"
            )
        directory = found[name][version]
        key = _stat_key(directory / MANIFEST)
        cached = self._bundles.get(directory)
        if cached is not None and cached[0] == key:
            return cached[1]
        spec = load_manifest(directory / MANIFEST)
        if (spec.name, spec.version) != (name, version):
            raise ModelError(
                f"{directory / MANIFEST} declares {spec.key} but lies in folder "
                f"{name}/{version}; the folder must be <name>/<version> of its model.yaml"
            )
        bundle = ModelBundle(
            spec, directory, allow_ungated=self.allow_ungated, serving=self.serving
        )
        self._bundles[directory] = (key, bundle)
        return bundle

    def bundles(self) -> list[ModelBundle]:
        """Every bundle found whose model.yaml reads, by name then version; broken ones
        are logged, skipped."""
        out: list[ModelBundle] = []
        for name in self.names():
            for version in self.versions(name):
                try:
                    out.append(self.get(name, version))
                except ModelError as exc:
                    logger.warning("skipping model bundle %s/%s: %s", name, version, exc.message)
        return out

    def list(self) -> list[BundleInfo]:
        """:meth:`bundles` described; one whose gate record is broken is logged, skipped."""
        infos: list[BundleInfo] = []
        for bundle in self.bundles():
            try:
                infos.append(bundle.info())
            except ModelError as exc:
                logger.warning("skipping model bundle %s: %s", bundle.key, exc.message)
        return infos
