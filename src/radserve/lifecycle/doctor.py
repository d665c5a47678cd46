"""``radserve doctor``: can this host serve? One check per line, each ok / warn / fail;
a failing check marked *blocking* stops ``radserve serve`` from starting.

Checks: Python and package versions, ONNX Runtime's package, version and providers, the
OpenVINO version (the ``openvino`` package or the runtime onnxruntime-openvino carries),
with a CUDA provider the CUDA / cuDNN versions it was built with beside the driver,
runtime, cuDNN and TensorRT libraries installed (``no CUDA provider`` otherwise), every
bundle's declared ``requires:`` and its install hashes, free memory against each
model's needs, the memory of each loaded session, data-dir disk space, database
reachability and migration head, the HTTP (and DICOM) port bindable, clock sanity, and
a proxy the environment names for an HTTP receiver that radserve cannot use (a SOCKS
``ALL_PROXY``: :mod:`radserve.http_proxies`).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

from radserve.config import Settings
from radserve.http_proxies import proxy_problems
from radserve.inference.providers import GPU_PROVIDERS
from radserve.lifecycle.install import site_registry, verify_install
from radserve.lifecycle.requirements import (
    OPENVINO,
    HostFacts,
    host_facts,
    unmet_requirements,
)
from radserve.lifecycle.version_commit import finish_commit, interrupted_build
from radserve.models.bf16 import bf16_refusal
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.checks import critical_rule_problem

Status = Literal["ok", "warn", "fail"]
PACKAGES = ("onnxruntime", "onnxruntime-openvino", "onnxruntime-gpu", "onnx", "numpy",
            "pydicom", "highdicom", "fastapi", "sqlalchemy", "alembic", "scipy")  # fmt: skip
MIN_FREE_DISK_BYTES = 1024**3


class LoadedSession(Protocol):
    """What doctor reads of a loaded session (:class:`radserve.inference.ModelSession`)."""

    spec: ModelSpec
    precision: str
    providers_in_use: tuple[str, ...]
    weights_bytes: int
    load_rss_bytes: int | None
    first_of_provider: bool


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    blocking: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _versions() -> list[Check]:
    out = [Check("python", "ok" if sys.version_info >= (3, 11) else "fail",
                 platform.python_version(), blocking=sys.version_info < (3, 11))]  # fmt: skip
    out.append(Check("packages", "ok", ", ".join(installed(PACKAGES, metadata.version))))
    clash = onnxruntime_clash(metadata.version)
    if clash:
        out.append(Check("onnxruntime packages", "fail", clash, blocking=True))
    return out


ONNXRUNTIME_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-openvino", "onnxruntime-gpu")


def installed(names: Sequence[str], version_of: Callable[[str], str]) -> list[str]:
    """``name version`` of each of ``names`` that is installed, in order."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {version_of(name)}")
        except metadata.PackageNotFoundError:
            continue
    return found


def onnxruntime_clash(version_of: Callable[[str], str]) -> str | None:
    """Why the installed onnxruntime cannot be trusted, or None: the three distributions
    install one ``onnxruntime`` module, so with two installed the later one overwrote some
    of the other's files (a GPU site that installed onnxruntime-gpu without uninstalling
    radserve's onnxruntime-openvino first)."""
    present = installed(ONNXRUNTIME_DISTRIBUTIONS, version_of)
    if len(present) < 2:
        return None
    return (
        f"{' and '.join(present)} are installed; they install the same onnxruntime module, "
        "so one overwrote the other's files: uninstall all of them, then install one "
        '(GPU: pip install "onnxruntime-gpu[cuda,cudnn]")'
    )


def _runtime(host: HostFacts) -> list[Check]:
    """ONNX Runtime's build and providers, OpenVINO, and the CUDA stack: what ONNX
    Runtime was built against beside what the installed libraries say they are."""
    from radserve.inference.build_info import runtime_build
    from radserve.lifecycle.native_libs import nvidia_stack

    build = runtime_build()
    detail = f"{build.package} {build.version}; providers {', '.join(build.providers)}"
    out = [Check("onnxruntime", "ok", detail + f"; opset <= {host.max_opset}")]
    if build.openvino:
        out.append(Check("openvino", "ok", build.openvino))
    else:
        out.append(Check("openvino", "ok", "no OpenVINO provider in this onnxruntime"))
    nvidia = nvidia_stack()
    found = [
        f"{what} {version}"
        for what, version in (
            ("driver supports CUDA", nvidia.driver),
            ("CUDA runtime", nvidia.runtime),
            ("cuDNN", nvidia.cudnn),
            ("TensorRT", nvidia.tensorrt),
        )
        if version
    ]
    gpu = [p for p in build.providers if p in GPU_PROVIDERS]
    if not gpu:
        libs = f" (installed NVIDIA libraries: {', '.join(found)})" if found else ""
        out.append(Check("cuda", "ok", f"no CUDA provider: CPU serving{libs}"))
        return out
    # onnxruntime-gpu 1.31 records the CUDA it was built with, no longer the cuDNN
    compiled = [f"CUDA {build.cuda_built or 'not recorded'}"]
    if build.cudnn_built:
        compiled.append(f"cuDNN {build.cudnn_built}")
    built = [f"built with {', '.join(compiled)}"]
    missing = [
        what
        for what, version in (("CUDA driver", nvidia.driver), ("cuDNN", nvidia.cudnn))
        if version is None
    ]
    if "TensorrtExecutionProvider" in gpu and nvidia.tensorrt is None:
        missing.append("TensorRT")
    installed = [f"installed: {', '.join(found)}"] if found else []
    detail = "; ".join([", ".join(gpu), *built, *installed])
    if missing:
        detail += f"; not found: {', '.join(missing)} (the provider will fail to start)"
    out.append(Check("cuda", "warn" if missing else "ok", detail))
    return out


def _sessions(sessions: Sequence[LoadedSession]) -> list[Check]:
    """Memory of each loaded session: its weights as stored and the host memory the
    process grew by while loading it (approximate; a GPU's device memory not counted)."""
    out = []
    for s in sessions:
        provider = s.providers_in_use[0] if s.providers_in_use else "?"
        if not hasattr(s, "weights_bytes"):  # a SessionRef: loaded by the executor's workers
            detail = f"{provider}: runs on the executor's workers; memory not measured here"
            out.append(Check(f"session {s.spec.key} {s.precision}", "ok", detail))
            continue
        parts = [f"{provider}: weights {s.weights_bytes / 2**20:.1f} MiB"]
        if s.load_rss_bytes is not None:
            first = ", with the provider's one-time start-up" if s.first_of_provider else ""
            parts.append(
                f"+{s.load_rss_bytes / 2**20:.0f} MiB resident at load (approximate{first})"
            )
        if provider in GPU_PROVIDERS:
            parts.append("device memory not measured")
        out.append(Check(f"session {s.spec.key} {s.precision}", "ok", ", ".join(parts)))
    return out


def _registry(settings: Settings) -> ModelRegistry:
    return site_registry(settings.models.dirs, settings.data_dir)


def _bundles(
    settings: Settings,
    host: HostFacts,
    serving: set[tuple[str, str]],
    providers: Sequence[str] = (),
) -> list[Check]:
    """Each bundle's ``requires:`` against the providers the server serves with
    (``providers``; empty: the host's) and its install hashes; and what a variant build
    of it that a kill cut short left: finished (the version whole with its variants) or
    not begun (the version as it was), said in its row (:mod:`.version_commit`)."""
    registry = _registry(settings)
    # first, so that each row describes the version as the finished commit left it
    finished = {b.directory: _finished_commit(b.directory) for b in registry.bundles()}
    out = []
    for info in registry.list():
        key = (info.name, info.version)
        bundle = registry.get(info.name, info.version)
        notes = [finished.get(bundle.directory), interrupted_build(bundle.directory)]
        problems = unmet_requirements(bundle.spec, host, providers=providers)
        problems += verify_install(bundle.directory)
        blocking = key in serving and bool(problems)
        status: Status = "ok" if not problems else ("fail" if blocking else "warn")
        detail = "; ".join(problems) or (
            servable_here(info.servable, host, providers)
            + (
                f"; needs {bundle.spec.requires.memory_mb} MB"
                if bundle.spec.requires.memory_mb
                else ""
            )
        )
        detail += "".join(f"; {note}" for note in notes if note)
        out.append(Check(f"model {info.name} {info.version}", status, detail, blocking))
    return out


def _finished_commit(directory: Path) -> str | None:
    """Finish a variant build's commit a kill cut short, saying so (None: there was
    none; one this user cannot finish is verify_install's reason to flag the version)."""
    try:
        return finish_commit(directory)
    except OSError:
        return None


def _critical_rules(settings: Settings) -> list[Check]:
    """The site's ``critical.rules``, each against the installed models' finding labels:
    a rule no installed model can meet never pushes (a pipeline's or a model's own rules
    are refused where they are declared; the site's were not checked before session
    31), and rules without ``critical.receivers`` push nowhere."""
    rules = settings.critical.rules
    if not rules:
        return []
    bundles = _registry(settings).bundles()
    out = []
    for i, rule in enumerate(rules):
        problem = critical_rule_problem(rule, bundles)
        detail = f"can never fire: it {problem}" if problem else "an installed model can meet it"
        out.append(
            Check(f"critical.rules[{i}] ({rule.describe()})", "warn" if problem else "ok", detail)
        )
    if not settings.critical.receivers:
        out.append(
            Check(
                "critical receivers",
                "warn",
                "critical.rules are set but no critical.receivers: nothing is pushed",
            )
        )
    return out


def _outbound_proxy(settings: Settings) -> list[Check]:
    """Blocking: an HTTP receiver (``fhir.url``, a critical receiver, the risk webhook)
    the environment's proxy variables send through a proxy radserve cannot use; before
    2026-12-07 a SOCKS ``ALL_PROXY`` was a traceback at the first send."""
    urls = [settings.fhir.url, settings.turnaround.risk_webhook_url]
    for receiver in settings.critical.receivers:
        if receiver.kind == "webhook":
            urls.append(receiver.url)
        elif receiver.kind == "fhir":
            urls.append(receiver.url or settings.fhir.url)
    problems = proxy_problems(url for url in urls if url is not None)
    return [Check("outbound proxy", "fail", problem, blocking=True) for problem in problems]


def servable_here(servable: Sequence[str], host: HostFacts, providers: Sequence[str] = ()) -> str:
    """The gated precisions this host can run: bf16 is OpenVINO's CPU plugin on a CPU with
    native bfloat16, and a gate passed elsewhere does not make it run here (an H200 host
    with onnxruntime-gpu listed it as servable, 2026-12-04); nor does a host that has
    OpenVINO where the server serves with another provider first (``providers``, the
    serving ones; empty: the host's choice). The rule is the registry's and the
    requirements' (:func:`radserve.models.bf16.bf16_refusal`)."""
    runs_bf16 = bf16_refusal(providers, host_runs_bf16=host.runs_bf16) is None
    here = [p for p in servable if p != "bf16" or runs_bf16]
    text = f"servable {', '.join(here)}"
    if len(here) < len(servable) and host.runs_bf16:
        text += (
            f"; bf16 gated but not served: this server serves with {', '.join(providers)} "
            f"(runtime.providers), and bf16 runs on {OPENVINO} only"
        )
    elif len(here) < len(servable):
        text += "; bf16 gated but not on this host (needs OpenVINO and AMX or AVX-512 BF16)"
    return text


def _disk(settings: Settings) -> Check:
    """Free space in the data dir; below :data:`MIN_FREE_DISK_BYTES` serve refuses to
    start, which the row says (it said only "0.0 GiB free")."""
    folder = settings.data_dir if settings.data_dir.exists() else settings.data_dir.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return Check("data dir disk", "fail", f"{folder}: {exc}", blocking=True)
    status: Status = "ok" if free >= MIN_FREE_DISK_BYTES else "fail"
    detail = f"{_size(free)} free in {folder}"
    if status == "fail":
        detail += (
            f"; `radserve serve` needs at least {_size(MIN_FREE_DISK_BYTES)} free there to "
            "start (doctor's fixed minimum, no setting): free space or move data_dir"
        )
    if settings.gateway.enabled:
        detail += (
            f"; the DICOM gateway refuses instances below gateway.min_free_bytes "
            f"({_size(settings.gateway.min_free_bytes)})"
        )
    return Check("data dir disk", status, detail, blocking=status == "fail")


def _size(count: int) -> str:
    """``40 MiB`` below a GiB, ``1.0 GiB`` from it (``0.0 GiB free`` said nothing)."""
    if count < 1024**3:
        return f"{count / 1024**2:.0f} MiB"
    return f"{count / 1024**3:.1f} GiB"


def _database(settings: Settings) -> Check:
    """The store: reachable and readable, its schema revision against this code's (one
    a newer radserve wrote fails, in serve's words: serve refuses it), a SQLite store in
    a read-only folder (serve cannot run on it), and the server holding it (info)."""
    from sqlalchemy import exc as sa_exc

    from radserve.store.audited import missing_data
    from radserve.store.db import make_engine, sqlite_file
    from radserve.store.migrate import current_revision, head_revision, serve_refusal
    from radserve.store.store import unreadable, writable

    url = settings.effective_database_url
    database = sqlite_file(url)
    if database is not None and database.is_dir():
        return Check("database", "fail", f"the SQLite store {database} is a folder, not a "
                     "database file: serve cannot open it", blocking=True)  # fmt: skip
    missing = missing_data(settings) if database is not None else None
    if database is not None and missing is not None:
        # not connected: a SQLite connection would create the file
        return _sqlite_to_create(database, missing)
    read_only = database is not None and not writable(database)
    try:
        engine = make_engine(url, read_only=read_only)
        try:
            current = current_revision(engine)
        finally:
            engine.dispose()
    except sa_exc.DBAPIError as exc:
        if database is None:  # the driver's text may name the host: its class only
            return Check("database", "fail", f"not reachable: {type(exc.orig).__name__}",
                         blocking=True)  # fmt: skip
        return Check("database", "fail", unreadable(url, exc, read_only=read_only).message,
                     blocking=True)  # fmt: skip
    except Exception as exc:  # any driver error means: not reachable
        return Check("database", "fail", f"not reachable: {type(exc).__name__}", blocking=True)
    refused = serve_refusal(current)
    if refused is not None:
        return Check("database", "fail", refused.message, blocking=True)
    if read_only and database is not None:
        return Check(
            "database",
            "fail",
            f"the SQLite store {database} is in a folder this user cannot write "
            f"({database.parent}: read-only file system or permissions): serve cannot run "
            "on it (keys list and audit verify can read it)",
            blocking=True,
        )
    head = head_revision()
    if current is None:
        detail = f"reachable; empty (migrated to {head} at start)"
    elif current != head:
        return Check("database", "warn", f"at {current}; {head} is applied at start")
    else:
        detail = f"reachable, migration head {head}"
    return Check("database", "ok", detail + _in_use(settings, database))


def _in_use(settings: Settings, database: Path | None) -> str:
    """``; in use by radserve serve pid N ...`` where another process holds the SQLite
    store's serving lock (:mod:`radserve.store.data_dir_lock`); empty otherwise."""
    from radserve.store.data_dir_lock import holder

    if database is None or settings.outbox.replicas > 1:
        return ""
    found = holder(database)
    if found is None or found.pid == os.getpid():  # none, or serve's own start-up check
        return ""
    return (
        f"; in use by `radserve serve` {found.describe()} (a second serve on this data dir "
        "is refused)"
    )


def _sqlite_to_create(database: Path, missing: str) -> Check:
    """No SQLite store yet (a host before its first serve): fine if serve can create it,
    a blocking failure if the folder it would go in cannot be made or written. (A
    server database is connected to as ever: that creates nothing.)"""
    folder = database.parent.absolute()
    while not folder.exists():
        folder = folder.parent
    if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
        return Check("database", "ok", f"{missing}: created at the first serve (not created now)")
    why = "is not a folder" if not folder.is_dir() else "cannot be written"
    return Check("database", "fail", f"{missing}, and {folder} {why}: serve cannot create it",
                 blocking=True)  # fmt: skip


def port_check(name: str, host: str, port: int) -> Check:
    """Whether ``host``:``port`` can be bound here (``demo --serve`` asks it before its
    minutes of work, in serve's words)."""
    if port == 0:
        return Check(name, "ok", "any free port")
    try:
        # the address's own family: an IPv4 socket refused '::' and '::1' (serve then did
        # not start on an IPv6 bind address the settings take)
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        return Check(name, "fail", f"{host}:{port} not bindable: {exc.strerror}", blocking=True)
    return Check(name, "ok", f"{host}:{port} bindable")


def _clock() -> Check:
    now = dt.datetime.now(dt.UTC)
    if now.year < 2024:
        return Check("clock", "fail", f"system clock says {now.isoformat()}", blocking=True)
    return Check("clock", "ok", now.isoformat(timespec="seconds"))


def run_doctor(
    settings: Settings,
    *,
    serving: set[tuple[str, str]] | None = None,
    check_ports: bool = True,
    sessions: Sequence[LoadedSession] = (),
    providers: Sequence[str] = (),
) -> list[Check]:
    """Every check; ``serving`` (name, version) pairs make a failing bundle blocking;
    ``sessions``: the loaded sessions whose memory to report; ``providers``: the
    execution providers the server serves with
    (:attr:`radserve.service.catalog.Catalog.serving_providers`), which each bundle's
    ``requires:`` is checked against (empty: the host's; before 2026-12-07 always the
    host's, so a server serving on the CPU provider started with a model requiring
    OpenVINO)."""
    host = host_facts()
    checks = [*_versions(), *_runtime(host)]
    checks += _bundles(settings, host, serving or set(), providers)
    checks += _critical_rules(settings)
    checks += _outbound_proxy(settings)
    checks += _sessions(sessions)
    checks += [_disk(settings), _database(settings), _clock()]
    if check_ports:
        checks.append(port_check("http port", settings.server.host, settings.server.port))
        if settings.gateway.enabled:
            checks.append(port_check("dicom port", settings.gateway.host, settings.gateway.port))
    if host.free_memory_mb is not None:
        checks.append(Check("memory", "ok", f"{host.free_memory_mb} MB available"))
    return checks


def blocking(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.blocking and c.status == "fail"]


__all__ = ["Check", "LoadedSession", "blocking", "port_check", "run_doctor"]
