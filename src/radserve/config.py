"""One typed, frozen settings object for the whole server, built once and passed in.

Sources, highest precedence first: explicit overrides (command-line flags) ->
``RADSERVE_*`` environment variables (``__`` separates nesting levels, e.g.
``RADSERVE_SERVER__PORT=9000``) -> an optional YAML or TOML file (``--config`` or
``RADSERVE_CONFIG``) -> defaults. Unknown keys are errors from every source, because a
misspelt setting that is silently ignored is a setting that silently does not apply.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import ipaddress
import json
import os
import re
import tomllib
import urllib.parse
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    RootModel,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from radserve.domain.critical import CriticalRule
from radserve.domain.device_slot import MAX_THREADS, DeviceSlot
from radserve.domain.priority import PriorityClass, PriorityRules
from radserve.errors import RadserveError, quoted
from radserve.labels import label_problem
from radserve.log_routing import redact_url
from radserve.validation_text import problem_message
from radserve.yaml_text import load_yaml_file, read_utf8

ENV_PREFIX = "RADSERVE_"
CONFIG_ENV = "RADSERVE_CONFIG"
# RADSERVE_* variables that are not settings: the config file path, test and training tools.
_NOT_SETTINGS = re.compile(r"^RADSERVE_(CONFIG|TEST_.*|TRAIN_.*)$", re.IGNORECASE)
SQLITE_FILE_NAME = "radserve.db"
AUTO_READ_PROCESSES = 2  # server.read_processes "auto" on a host with >= 2 usable cores
_DB_URL = re.compile(r"^(sqlite|postgres|postgresql)(\+\w+)?://", re.IGNORECASE)


class ConfigError(RadserveError):
    """The configuration cannot be loaded: unknown key, bad value, unreadable file."""

    code = "config_invalid"


# the longest duration a setting takes: a year. Python's waits, socket timeouts and
# datetimes overflow long before 1e300 s (a thread's wait raised OverflowError and the
# thread died; `radserve gateway echo --timeout 1e300` ended in a traceback), and a
# duration over a year is a typo, most often in its units
MAX_DURATION_S = 366 * 86_400.0


def _duration(unit_s: float, unit: str) -> Any:
    """A float setting in ``unit`` (``unit_s`` seconds each) of at most MAX_DURATION_S."""

    def at_most_a_year(value: float) -> float:
        if value * unit_s > MAX_DURATION_S:
            raise ValueError(
                f"{value:g} {unit} is over a year ({MAX_DURATION_S / unit_s:,.0f} {unit}); "
                "check the units"
            )
        return value

    return Annotated[float, AfterValidator(at_most_a_year)]


Seconds = _duration(1.0, "s")
Milliseconds = _duration(1e-3, "ms")
Days = _duration(86_400.0, "days")


@dataclass(frozen=True)
class SecondsRange:
    """Both ends of a duration setting where each matters: a wait on a peer (a year-long
    timeout on a critical receiver that never answered held its lane ``sending`` with no
    error shown) or how often something is retried or polled (5e-324 s retried a down
    receiver ~15 times a second, each attempt a warning line). Kept in the field's
    metadata, so tests and tools read the bounds from the settings themselves."""

    low_s: float
    high_s: float
    why: str

    def check(self, value: float) -> float:
        if not self.low_s <= value <= self.high_s:
            raise ValueError(f"must be from {self.low_s:g} to {self.high_s:g} s ({self.why})")
        return value


def _seconds_in(bounds: SecondsRange) -> Any:
    return Annotated[float, AfterValidator(bounds.check), bounds]


# a peer's answer (an HTTP or syslog receiver, a FHIR server, a DICOM peer): each attempt
# of a sender ends within this, answered or not (radserve.http_deadline for HTTP)
PEER_TIMEOUT = SecondsRange(0.1, 300.0, "the longest one attempt may wait on a peer")
# a back-off's waits between attempts to a peer that failed
RETRY_INTERVAL = SecondsRange(0.1, 86_400.0, "a wait between attempts, at most a day")
# how often a loop looks again (a table, a probe, a recomputation)
POLL_INTERVAL = SecondsRange(0.01, 3600.0, "how often it looks again, at most an hour")
PeerTimeout = _seconds_in(PEER_TIMEOUT)
RetryInterval = _seconds_in(RETRY_INTERVAL)
PollInterval = _seconds_in(POLL_INTERVAL)


def _involves(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field's type is one of ``kinds`` or a union / container holding one."""
    if annotation in kinds:
        return True
    if get_origin(annotation) is Literal:
        return False
    return any(_involves(arg, kinds) for arg in get_args(annotation))


def _refuse_lax_value(model: type[BaseModel], name: str | None, value: Any) -> Any:
    """What pydantic's lax mode would take for a setting and the operator did not mean:
    ``true`` for a number (``port: true`` was port 1) and an empty path (``data_dir: ""``
    or ``RADSERVE_DATA_DIR=`` was the working folder). A setting left out keeps its
    default; one given must say what it means."""
    field = model.model_fields.get(name or "")
    if field is None:
        return value
    numeric = _involves(field.annotation, (int, float))
    if isinstance(value, bool) and numeric and not _involves(field.annotation, (bool,)):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    if isinstance(value, str) and not value.strip() and _involves(field.annotation, (Path,)):
        raise ValueError("must name a path, not an empty one (leave it out for its default)")
    return value


class _Section(BaseModel):
    # no setting means "infinity" (0 or null says "none" where a limit can be off): an
    # infinite timeout hangs a worker on a peer that never answers (fhir.timeout_s:
    # .inf was taken before session 31), and NaN fails every bound it is checked against
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_values(cls, value: Any, info: ValidationInfo) -> Any:
        return _refuse_lax_value(cls, info.field_name, value)


class TlsSettings(_Section):
    """TLS for one endpoint (the DICOM gateway or the HTTP API): TLS 1.2 or later only.

    ``cert`` + ``key``: this side's certificate chain and private key (PEM). ``ca``: the
    CA bundle trusted for the other side's certificates. As a server with ``ca`` set,
    clients must present a certificate signed by it (``require_client_cert``; false: a
    certificate is verified only when offered); without ``ca`` none is asked for. As a
    DICOM client (the outbox), ``ca`` verifies the PACS and ``cert`` + ``key`` are the
    client certificate offered to it."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    require_client_cert: bool = True

    @model_validator(mode="after")
    def _pairs(self) -> TlsSettings:
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key go together: set both or neither")
        return self


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")  # "_": hosts files allow it


def check_host(value: str, what: str = "host") -> str:
    """A host radserve reaches a peer at or listens on: an IP address (IPv6 with a zone
    too) or a host name of RFC 1123 labels; ValueError otherwise. Checked at load:
    before, a name with an empty or over-long label ("pacs..local") passed, and resolving
    it raised UnicodeError from the idna codec: a traceback at the gateway's start, an
    outbox "internal error" at every send."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    if not name or len(name) > 253 or not all(_HOST_LABEL.match(p) for p in name.split(".")):
        raise ValueError(
            f"{what} {value!r} is neither an IP address nor a host name (labels of 1-63 "
            "letters, digits, hyphens or underscores, separated by dots)"
        )
    return value


# a host radserve connects to (a syslog collector, a critical receiver): checked as a
# DICOM peer's is; an idna UnicodeError escaped the senders' OSError handling
HostName = Annotated[str, AfterValidator(check_host)]


class ServerSettings(_Section):
    # the address to listen on, checked as the hosts radserve connects to are: an empty
    # one bound every interface without a word ("0.0.0.0" or "::" say so)
    host: HostName = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    metrics_require_key: bool = False
    max_upload_bytes: int = Field(default=2 * 1024**3, gt=0)
    request_timeout_s: Seconds = Field(default=60.0, gt=0)
    # a request body must arrive at this average rate or faster, after a head start of
    # request_timeout_s (Apache's mod_reqtimeout rule): a client trickling an upload is
    # answered 408 and closed. 1 KiB/s is ~100x below a slow 1 Mbit/s hospital link, so
    # a real upload is never cut (a 300-slice CT, ~160 MB, would need over 40 h)
    min_body_rate_bytes_s: int = Field(default=1024, gt=0)
    # API reader processes (radserve.api.reader): job status and report reads on the
    # public port answered by processes that run no inference, every other request
    # forwarded to the serving process; 0: one process serves everything. "auto" (the
    # default): 2 where this process may use >= 2 cores, else 0 (reader_count). On the
    # quiet 2-core host, studies processing: 3,024 / 2,866 req/s p99 35-36 ms with 2
    # against 852-911 req/s p99 ~210 ms in one process, for ~260 MiB PSS more and a
    # few seconds more to start and stop (docs/api-performance.md, docs/scaling.md)
    read_processes: Annotated[int, Field(ge=0, le=32)] | Literal["auto"] = "auto"
    # proxies (addresses or CIDRs) whose X-Forwarded-For/-Proto are believed: the audit
    # and the job keep the client address they name. Empty: believe none (any client
    # could otherwise set the address radserve audits); docs/deployment.md
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    # how long a request (a submission at any door: its job row; an API key's check)
    # waits for a database that does not answer (a PostgreSQL restart or failover)
    # before it is refused 503 with Retry-After; 0: refused at once. Nothing is
    # acknowledged before its row commits (radserve.store.waiting)
    store_wait_s: Seconds = Field(default=20.0, ge=0, le=300)
    # HTTPS when set (cert + key required; ca: mutual TLS for API clients)
    tls: TlsSettings | None = None

    def reader_count(self) -> int:
        """``read_processes`` on this host: "auto" is 2 with >= 2 usable cores (the
        layout measured best on 2 cores), else 0 (a reader would only take the one core
        from the inference)."""
        if self.read_processes != "auto":
            return self.read_processes
        from radserve.host import usable_cores

        return AUTO_READ_PROCESSES if usable_cores() >= 2 else 0

    @field_validator("tls")
    @classmethod
    def _https_needs_a_certificate(cls, value: TlsSettings | None) -> TlsSettings | None:
        if value is not None and value.cert is None:
            raise ValueError("HTTPS needs server.tls.cert and server.tls.key")
        return value


class JobSettings(_Section):
    """Per-job limits the scheduler enforces (:class:`radserve.scheduling.Scheduler`)."""

    # from the job's start; the job fails with job_timeout at its next batch boundary
    timeout_s: Seconds = Field(default=900.0, gt=0)
    # extra attempts after a retryable failure (errors with ``retryable=True``)
    max_retries: int = Field(default=2, ge=0)
    # how long a job waits before each retry (its other work pauses too; 0: at once)
    retry_backoff_s: Seconds = Field(default=5.0, ge=0)
    # replicas sharing one database (``outbox.replicas`` > 1, ``outbox.instance_id``):
    # the accepting replica holds each unfinished job's lease for ``lease_s``, renewed
    # every third of it; every ``lease_poll_s`` each replica takes over the jobs whose
    # lease expired (their replica died). One server alone holds every lease.
    lease_s: Seconds = Field(default=60.0, gt=0)
    lease_poll_s: PollInterval = 5.0
    # how long a job's progress write (running, its result and deliveries, failed) waits
    # for a database that does not answer (a restart); past it the write is held and
    # made, in order, when the database answers again (radserve.service.deferred)
    store_outage_wait_s: Seconds = Field(default=120.0, ge=0)
    # job records kept in memory per process (the serving process and each API reader)
    # so status reads need no database round trip; ~3.3 KiB each (20,000: ~65 MiB)
    cache_records: int = Field(default=20_000, ge=1)


class _PerClass(_Section):
    def for_class(self, priority_class: PriorityClass | str) -> Any:
        """The value for one class (``URGENT`` -> field ``urgent``). A class (or its exact
        value) is looked up, not converted: the scheduler's ranking asks per job and
        decision, and the enum conversion was most of a planner run's CPU."""
        name = _FIELD_OF_CLASS.get(priority_class)
        return getattr(self, name or PriorityClass(priority_class).value.lower())


_FIELD_OF_CLASS = {c: c.value.lower() for c in PriorityClass}


class ClassTats(_PerClass):
    """Turnaround targets in seconds; deadline = arrival + the class's TAT.

    URGENT work starts at once whatever its TAT (ranking, ``urgent_exclusive``); its TAT
    is the *completion* target a deadline miss is counted against (60 s: an emergency
    CT read by AI within a minute). ``0`` (the former default, "start at once") is read
    as 60 s, so a settings file written by an older ``config show`` keeps its meaning."""

    urgent: Seconds = Field(default=60.0, gt=0)
    inpatient: Seconds = Field(default=300.0, ge=0)
    outpatient: Seconds = Field(default=1800.0, ge=0)

    @field_validator("urgent", mode="before")
    @classmethod
    def _zero_is_the_default_target(cls, value: object) -> object:
        return 60.0 if value in (0, "0", 0.0) else value


class QueueLimits(_PerClass):
    """Waiting jobs per class before new work is refused (503). ``None``: no limit.

    URGENT work is never refused, so its limit must stay ``None``.
    """

    urgent: None = None
    inpatient: int | None = Field(default=200, gt=0)
    outpatient: int | None = Field(default=500, gt=0)

    @field_validator("urgent", mode="before")
    @classmethod
    def _urgent_unlimited(cls, value: object) -> None:
        if value is not None:
            raise ValueError("URGENT work is never refused: remove its queue limit")
        return None


class SchedulerSettings(_Section):
    """What :class:`radserve.scheduling.Scheduler` decides with (it takes this object,
    with :class:`JobSettings` and the :class:`PriorityRules`); times in seconds unless
    the name says otherwise."""

    tat_s: ClassTats = ClassTats()
    queue_limits: QueueLimits = QueueLimits()
    # a routine job is promoted one class once its slack < aging_fraction x its TAT
    aging_fraction: float = Field(default=0.25, ge=0, le=1)
    # items per device call (capped by what the runtime's device is worth sending)
    max_batch_size: int = Field(default=32, ge=1)
    # how long a routine batch may wait for a compatible one (URGENT never waits)
    max_queue_delay_ms: Milliseconds = Field(default=5.0, ge=0)
    # consecutive device failures that open a model's circuit breaker
    breaker_threshold: int = Field(default=3, ge=1)
    # while URGENT work can run (an URGENT job waiting or running; not one backing off
    # after a retryable failure or held at an open breaker), start no work of other
    # classes (devices and CPU pool): right for CPU-bound hosts; with several GPUs it may
    # be turned off
    urgent_exclusive: bool = True
    # while URGENT work can run (as for urgent_exclusive), routine CPU stages already
    # running pause at their next checkpoint (each header read, decoding job, label map:
    # radserve.checkpoints)
    yield_to_urgent: bool = True
    # routine jobs started at once (each holds a loaded volume; URGENT may exceed it)
    max_running: int = Field(default=4, ge=1, le=MAX_THREADS)
    # batches prepared ahead per job, and in total, while the device is busy
    lookahead_batches: int = Field(default=2, ge=1)
    max_prepared_batches: int = Field(default=6, ge=1)
    # Retry-After of a full queue before any job has finished to estimate it from
    default_retry_after_s: int = Field(default=30, ge=1, le=86_400)  # at most a day

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_ms / 1000.0

    def tat(self, priority_class: PriorityClass) -> float:
        return float(self.tat_s.for_class(priority_class))

    def queue_limit(self, priority_class: PriorityClass) -> int | None:
        limit: int | None = self.queue_limits.for_class(priority_class)
        return limit

    def capped(self, device_max_batch: int | None) -> SchedulerSettings:
        """These settings with ``max_batch_size`` at most ``device_max_batch`` (on a CPU
        device, merging studies' batches into one call is no faster and its activations
        grow with it)."""
        if device_max_batch is None or device_max_batch >= self.max_batch_size:
            return self
        return self.model_copy(update={"max_batch_size": device_max_batch})


class ModelsSettings(_Section):
    # extra bundle roots, searched before the bundled models
    dirs: tuple[Path, ...] = ()
    precision: Literal["fp32", "fp16", "int8", "bf16"] | None = None


class RuntimeSettings(_Section):
    """Which ONNX Runtime providers serve, in order (empty: the host's best, TensorRT >
    CUDA > OpenVINO > CPU), and the CPU threads (empty: the usable cores). A provider
    named here that the installed onnxruntime lacks stops the server with a reason."""

    providers: tuple[str, ...] = ()
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)


# a Ray head's address: a host name or IPv4 address, or an IPv6 one in brackets, a port
_RAY_HEAD = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")


class RaySettings(_Section):
    """The cluster executor (``executor: ray``; needs ``pip install 'radserve[ray]'``).

    ``address``: ``local`` starts a Ray instance inside the server (one host), anything
    else is a running cluster's head (``HOST:6379``, or ``auto``). ``devices``: one
    worker actor per entry: ``cpu:N`` a CPU slot with N threads, ``gpu`` a GPU, ``gpu:0.5``
    half of one (two workers share it); ``@RESOURCE`` after an entry places that worker
    on a node started with that Ray custom resource. A worker past ``batch_timeout_s``
    on one batch is killed and restarted (at most ``max_restarts`` times, then
    replaced); its batch runs on another worker."""

    address: str = Field(default="local", min_length=1)
    devices: tuple[
        Annotated[str, Field(pattern=r"^(cpu|gpu)(:\d+(\.\d+)?)?(@[A-Za-z0-9_.-]+)?$")], ...
    ] = Field(default=("cpu:1",), min_length=1)
    # address: local only (Ray refuses more than 1e14 of a resource, with a traceback)
    num_cpus: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    # Ray refuses an object store under 75 MiB (78,643,200 bytes) when it starts
    object_store_mb: int | None = Field(default=None, ge=75, le=2**24)  # <= 16 TiB
    batch_timeout_s: Seconds = Field(default=300.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)
    startup_timeout_s: Seconds = Field(default=120.0, gt=0)

    @field_validator("devices")
    @classmethod
    def _devices_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, entry in enumerate(value):
            DeviceSlot.parse(entry, index)  # gpu:1.5, cpu:0: refused here, naming it
        return value

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str) -> str:
        # Ray's own refusal ("Invalid address format") came as a traceback once serving
        head = _RAY_HEAD.fullmatch(value)
        if value in ("local", "auto") or (head and 0 < int(head.group(2)) <= 65535):
            return value
        raise ValueError(
            "must be local, auto or a Ray head's HOST:PORT (e.g. 10.0.0.5:6379, [fd00::5]:6379)"
        )


class StorageSettings(_Section):
    """Watching the data folder (shared storage in a cluster: NFS and the like). A probe
    writes, fsyncs and removes a small file under ``data_dir`` every
    ``probe_interval_s``; one that fails, or does not finish within ``probe_timeout_s``
    (a hung mount), makes ``/readyz`` say not ready until a probe succeeds again -- or,
    with ``fallback_dir``, ready but degraded while studies and results go there."""

    probe_interval_s: PollInterval = 5.0
    probe_timeout_s: Seconds = Field(default=10.0, gt=0)
    # a local folder for studies and results while data_dir cannot be written; moved
    # back when it can (radserve.service.failover). None: such uploads are refused (503)
    fallback_dir: Path | None = None
    # Retention (radserve.service.retention), in days, at most a year; null keeps them
    # for good. 0 is refused: it reads as "keep nothing" as well as "no limit".
    # - the stored copy of a study (studies/<fp>/) once every job of it has been final
    #   that long and nothing stored it again meanwhile (the PACS is the archive; the
    #   console's study view and a job's FHIR Patient read it until then)
    source_retention_days: Days | None = 7.0
    # - the DICOM gateway's and STOW-RS's received copy (incoming/<study>/, quarantine/),
    #   that long after its last instance, once handed over: a late instance re-runs the
    #   study from this copy (all its instances), so keep it as long as late instances
    #   should be added to the study rather than make a study of their own
    incoming_retention_days: Days | None = 7.0
    # - a job's result folder and its index rows (the result cache, DICOMweb's index),
    #   once every job it answers is final that long and none of its deliveries waits
    result_retention_days: Days | None = None
    retention_interval_s: PollInterval = 600.0  # a pass at start, then this often
    retention_max_per_pass: int = Field(default=500, gt=0, le=100_000)  # folders, per kind

    @field_validator(
        "source_retention_days", "incoming_retention_days", "result_retention_days", mode="before"
    )
    @classmethod
    def _retention_null(cls, value: Any) -> Any:
        # a RADSERVE_STORAGE__*_RETENTION_DAYS variable says null as text
        if isinstance(value, str) and value.strip().lower() == "null":
            return None
        return value

    @field_validator("source_retention_days", "incoming_retention_days", "result_retention_days")
    @classmethod
    def _retention(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:  # at most a year: Days
            raise ValueError(f"{value:g} days: must be over 0; null keeps them for good")
        return value


class PipelinesSettings(_Section):
    dirs: tuple[Path, ...] = ()
    default: str = "ct-chest-abdomen"


class IngestSettings(_Section):
    """Defaults for :class:`radserve.ingest.IngestPolicy`: every one of its fields, same
    names, same meaning (a test keeps them equal); ``IngestPolicy.from_settings`` builds
    it (config imports no stage code)."""

    missing_slices: Literal["reject", "flag", "resample"] = "reject"
    nonuniform_spacing: Literal["reject", "flag", "resample"] = "reject"
    gantry_tilt: Literal["reject", "flag", "correct"] = "reject"
    duplicate_positions: Literal["reject", "drop_identical", "keep_first"] = "drop_identical"
    mixed_orientation: Literal["split", "reject"] = "split"
    mismatched_dimensions: Literal["split", "reject"] = "split"
    localizers: Literal["drop", "reject"] = "drop"
    # the same bounds IngestPolicy checks, so a bad value is refused at load, naming it
    missing_slice_factor: float = Field(default=1.5, gt=1)
    spacing_tolerance: float = Field(default=0.02, gt=0, lt=0.5)
    tilt_tolerance_deg: float = Field(default=0.5, ge=0)
    ct_padding_hu: float = -1000.0
    other_padding_value: float = 0.0
    # Bounds on what one ingest may read and build (see IngestPolicy for each)
    max_voxels: int = Field(default=2**30, gt=0)
    max_file_bytes: int = Field(default=4 * 2**30, gt=0)
    max_header_bytes: int = Field(default=64 * 2**20, gt=0)
    max_header_elements: int = Field(default=500_000, gt=0)
    max_study_bytes: int = Field(default=16 * 2**30, gt=0)
    max_frames: int = Field(default=50_000, gt=0)
    max_archive_members: int = Field(default=50_000, gt=0)
    min_spacing_mm: float = Field(default=0.01, gt=0)
    max_pixel_spacing_mm: float = Field(default=20.0, gt=0)
    max_slice_spacing_mm: float = Field(default=50.0, gt=0)
    max_fov_mm: float = Field(default=2500.0, gt=0)
    max_in_plane_field_mm: float = Field(default=1000.0, gt=0)  # a CT, MR or PET image's plane
    min_matrix: int = Field(default=8, gt=0)
    # a study outside a model's declared input_domain (model.yaml): a report warning, or refused
    input_domain: Literal["flag", "refuse"] = "flag"
    # lossy compressed images (Lossy Image Compression 01, JPEG Baseline): run with a
    # lossy_input report warning, or refused
    lossy_input: Literal["flag", "refuse"] = "flag"

    @model_validator(mode="after")
    def _spacings_ordered(self) -> IngestSettings:
        # IngestPolicy's own check, here so it is refused at load naming the settings:
        # before, min_spacing_mm: 100 passed and the server's start ended in a traceback
        largest = min(self.max_pixel_spacing_mm, self.max_slice_spacing_mm)
        if not self.min_spacing_mm < largest:
            raise ValueError(
                f"min_spacing_mm ({self.min_spacing_mm:g}) must be below max_pixel_spacing_mm "
                f"({self.max_pixel_spacing_mm:g}) and max_slice_spacing_mm "
                f"({self.max_slice_spacing_mm:g})"
            )
        return self


# PS3.5 AE VR: 1-16 characters of the default repertoire, no backslash, not only spaces
_AE_TITLE = re.compile(r"^[\x20-\x5b\x5d-\x7e]{1,16}$")
ANY_HOST = "*"


def check_ae_title(value: str) -> str:
    """The AE title without padding; ValueError if DICOM would not carry it."""
    if not isinstance(value, str) or not _AE_TITLE.match(value) or not value.strip():
        raise ValueError(
            f"{value!r} is not a valid DICOM AE title: 1-16 printable ASCII characters, "
            "no backslash, not only spaces"
        )
    return value.strip()


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def check_certificate_identity(value: str) -> str:
    """A client certificate as ``gateway.ae_certificates`` names it, normalised:
    ``cn:NAME`` (its subject common name) or ``sha256:HEX`` (the SHA-256 fingerprint of
    the certificate, as ``openssl x509 -fingerprint -sha256`` prints it: colons and case
    ignored); ValueError otherwise."""
    kind, colon, rest = str(value).partition(":")
    kind = kind.strip().lower()
    if colon and kind == "cn" and rest.strip():
        return f"cn:{rest.strip()}"
    if colon and kind == "sha256":
        digest = re.sub(r"[\s:]", "", rest).lower()
        if _SHA256_HEX.match(digest):
            return f"sha256:{digest}"
    raise ValueError(
        f"{value!r} names no certificate: write cn:<subject common name> or "
        "sha256:<the certificate's SHA-256 fingerprint, 64 hex digits>"
    )


class DicomPeer(_Section):
    """A DICOM peer: allowed to associate with the SCP as ``ae_title`` from ``host``
    (``"*"``: any address), and, with a ``port``, a destination for results (the
    outbox, over TLS when ``tls``)."""

    ae_title: str
    host: str = ANY_HOST
    port: int | None = Field(default=None, ge=1, le=65535)
    tls: bool = False
    # a destination (with a port): after its results are stored, ask for storage
    # commitment (N-ACTION) and count them delivered only once it reports them
    # committed; no report within commitment_timeout_s: stored again (the outbox's
    # back-off and give-up apply). The peer reports on radserve's SCP (gateway.port)
    storage_commitment: bool = False
    commitment_timeout_s: Seconds = Field(default=600.0, gt=0)

    def __init__(self, /, *args: Any, **data: Any) -> None:
        # positional (ae_title, host, port) for brevity in code: DicomPeer("PACS", "10.0.0.5")
        data.update(zip(("ae_title", "host", "port"), args, strict=False))
        super().__init__(**data)

    @field_validator("ae_title")
    @classmethod
    def _valid_ae_title(cls, value: str) -> str:
        return check_ae_title(value)

    @field_validator("host")
    @classmethod
    def _valid_host(cls, value: str) -> str:
        return value if value == ANY_HOST else check_host(value)

    @model_validator(mode="after")
    def _destination_has_a_host(self) -> DicomPeer:
        if self.host == ANY_HOST and (self.port is not None or self.tls):
            raise ValueError(f"peer {self.ae_title}: a port or tls needs a host to send to")
        return self

    @model_validator(mode="after")
    def _commitment_needs_a_destination(self) -> DicomPeer:
        if self.storage_commitment and self.port is None:
            raise ValueError(
                f"peer {self.ae_title}: storage_commitment is for a destination: give it a port"
            )
        return self


class GatewaySettings(_Section):
    """The DICOM gateway: the storage SCP (studies in) and the outbox SCU (results out).

    One set of knobs for ``radserve serve`` and ``radserve gateway scp`` (whose flags
    override these). The SCP listens on ``host``:``port`` (``0.0.0.0``/``::``: every
    interface), with TLS when ``tls`` has a certificate; results go to the allowed
    peers that have a port. See docs/conformance.md for what each knob changes."""

    enabled: bool = False
    ae_title: str = "RADSERVE"
    host: HostName = "127.0.0.1"  # checked as ServerSettings.host
    port: int = Field(default=11112, ge=0, le=65535)  # 0: any free port (tests)
    # empty: any calling AE is accepted (logged as a warning at start)
    allowed_peers: tuple[DicomPeer, ...] = ()
    require_called_ae_title: bool = True
    # non-image storage classes: accept and keep aside, or refuse at association
    unwanted: Literal["quarantine", "refuse"] = "quarantine"
    # seconds without a new instance before a study is complete
    quiet_s: Seconds = Field(default=10.0, gt=0)
    # a study whose association was cut off (abort, server crash) waits this long for
    # the sender to resume before it is taken as complete
    interrupted_quiet_s: Seconds = Field(default=300.0, gt=0)
    # instances after a study was handed over: run it again, or flag it
    late_policy: Literal["rerun", "flag"] = "rerun"
    # C-STORE answers 0xA700 when a write would leave less free space than this
    min_free_bytes: int = Field(default=512 * 1024**2, ge=0)
    # how a received instance is made durable before its C-STORE success: "per_instance"
    # (each handler flushes its own file and folder) or "group" (one committer thread
    # flushes every instance waiting at once, so concurrent associations share flushes);
    # group_sync: "fsync" each file of a batch, or one "syncfs" of the file system per
    # batch (fewer flushes, but it also writes back other processes' data on that file
    # system: for a data folder on a file system of its own). See radserve.gateway.storage
    # and the README's Performance section (group is not the default: not yet shown
    # faster through the SCP on this machine)
    durability: Literal["per_instance", "group"] = "per_instance"
    group_sync: Literal["fsync", "syncfs"] = "fsync"
    max_associations: int = Field(default=16, ge=1)
    # connections at once from one source address (closed at accept beyond it)
    max_associations_per_host: int = Field(default=8, ge=1)
    # slots only addresses of allowed peers (with a concrete host) may use, so strangers
    # holding connections open cannot lock the PACS out
    reserved_for_peers: int = Field(default=4, ge=0)
    # a PDU must arrive whole this long after its read began; longer ones are refused
    pdu_timeout_s: PeerTimeout = 30.0
    max_pdu_bytes: int = Field(default=1024**2, ge=16 * 1024)
    # the maximum P-DATA PDU the SCP advertises (capped at max_pdu_bytes): senders such
    # as dcmtk's storescu cut each instance into PDUs of this size, each one a round of
    # Python in the receiving process (pynetdicom's default, 16382: ~32 a 512 KiB image;
    # 1 MiB since 2026-12-02: less CPU per instance in every cell of the cstore bench)
    advertised_pdu_bytes: int = Field(default=1024**2, ge=4096)
    # processes that receive associations (1: this process). More than 1: this process
    # accepts and admits connections (the limits above stay exact) and hands each to
    # the receiving process with the fewest open, which stores and reports every
    # instance back (radserve.gateway.receivers); one that dies is started again.
    # 2 with a 1 MiB PDU measured on the idle 2-core machine: 172 / 268 / 223
    # instances/s with 1 / 4 / 8 associations against 154 / 101 / 76 for one process
    # with pynetdicom's PDU (docs/performance.md, goal 6); the default since session 34,
    # when every gateway test passed with it (its first suite run, session 20, found a
    # hang at shutdown, fixed then). Each receiving process costs ~133 MiB of its own.
    receivers: int = Field(default=2, ge=1, le=64)
    # ACSE: waiting for an association request/answer (also: idle new connections);
    # DIMSE: waiting for a message; network: an established association with no traffic
    acse_timeout_s: PeerTimeout = 30.0
    dimse_timeout_s: PeerTimeout = 60.0
    network_timeout_s: PeerTimeout = 60.0
    # the outbox SCU: TCP connect
    connect_timeout_s: PeerTimeout = 10.0
    # the outbox's back-off for results to the PACS: first wait, doubling up to the
    # cap, then failed_permanent this long after the result was queued
    retry_first_s: RetryInterval = 30.0
    retry_max_s: RetryInterval = 3600.0
    give_up_after_s: Seconds = Field(default=72 * 3600.0, gt=0)
    # SCP: TLS when cert + key are set; outbox: ca (required) and cert + key for peers
    # with ``tls: true``
    tls: TlsSettings | None = None
    # SCP over TLS: calling AE title -> the client certificates that may call as it
    # ("cn:<subject CN>" or "sha256:<fingerprint>"). A title listed is accepted only with
    # one of its certificates, a certificate listed only as one of its titles; empty: any
    # certificate tls.ca signed may call as any AE title (docs/conformance.md)
    ae_certificates: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @field_validator("ae_title")
    @classmethod
    def _valid_ae_title(cls, value: str) -> str:
        return check_ae_title(value)

    @field_validator("ae_certificates")
    @classmethod
    def _valid_ae_certificates(
        cls, value: dict[str, tuple[str, ...]]
    ) -> dict[str, tuple[str, ...]]:
        tied: dict[str, tuple[str, ...]] = {}
        for title, identities in value.items():
            if not identities:
                raise ValueError(f"{title!r}: list at least one certificate")
            tied[check_ae_title(title)] = tuple(
                dict.fromkeys(check_certificate_identity(i) for i in identities)
            )
        return tied

    @model_validator(mode="after")
    def _ae_certificates_need_client_certificates(self) -> GatewaySettings:
        tls = self.tls
        if self.ae_certificates and (tls is None or tls.cert is None or tls.ca is None):
            raise ValueError(
                "ae_certificates ties AE titles to client certificates: the SCP asks for "
                "them only over TLS with a CA (set gateway.tls.cert, key and ca)"
            )
        return self

    @model_validator(mode="after")
    def _retry_first_within_max(self) -> GatewaySettings:
        _check_backoff(self.retry_first_s, self.retry_max_s)
        return self

    @model_validator(mode="after")
    def _reserve_fits(self) -> GatewaySettings:
        if self.reserved_for_peers >= self.max_associations:
            raise ValueError("reserved_for_peers must be less than max_associations")
        return self

    @model_validator(mode="after")
    def _tls_peers_need_a_ca(self) -> GatewaySettings:
        tls_peers = [peer.ae_title for peer in self.allowed_peers if peer.tls]
        if tls_peers and (self.tls is None or self.tls.ca is None):
            raise ValueError(
                f"peers {', '.join(tls_peers)} use TLS: set gateway.tls.ca, the CA that "
                "signs their certificates (radserve never sends to an unverified peer)"
            )
        return self


class ResultsSettings(_Section):
    """What goes into the DICOM results (SEG + TID 1500 SR always, when any are written).

    ``secondary_capture_key_images`` adds each PNG key image as an RGB Secondary Capture
    in its own series of the source study, for viewers without SEG support."""

    secondary_capture_key_images: bool = False
    # a job that fails after its study was accepted: "fhir" sends a DiagnosticReport
    # with status cancelled through the FHIR outbox (when fhir.url is set); "sr" sends a
    # Comprehensive 3D SR saying the analysis failed through the DICOM outbox (studies
    # received by the gateway, when it has destinations); "both" (default) each channel
    # that is configured; "none": only the job state, the log and the metrics say so
    failure_notice: Literal["none", "fhir", "sr", "both"] = "both"


class DicomwebSettings(_Section):
    """DICOMweb (STOW-RS in, WADO-RS of results out) under ``/dicomweb``.

    ``completeness``: ``request`` makes each STOW-RS request a complete study (one job
    per Study Instance UID in it, started at once); ``quiet`` files the instances and
    starts the job once the study has had no new instance for ``quiet_s`` seconds (for
    senders that split a study over several requests). A request may choose with
    ``?complete=true|false``."""

    completeness: Literal["request", "quiet"] = "request"
    quiet_s: Seconds = Field(default=10.0, gt=0)


_SYSTEM_URI = r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$"  # an absolute URI (urn:oid:…, https://…)


def check_http_url(value: str) -> str:
    """A URL radserve POSTs to (FHIR server, webhook), checked at load as the sending
    client (httpx) parses it: http or https, a host, a port of 1-65535, no whitespace or
    control character. Before, ``http://[::1/hook`` and ``http://h:70000/`` loaded and
    every send raised (a traceback each time, the row left ``sending``). The URL is not
    quoted in the error: it may carry a password."""
    what = "must be an http:// or https:// URL with a host"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{what}, without spaces, line breaks or control characters")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
        host = parts.hostname
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range", a port not a number
        raise ValueError(f"{what}: it does not parse ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{what} (scheme {parts.scheme or 'missing'!r})")
    if not host:
        raise ValueError(f"{what} (the host is missing)")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{what}: its port must be 1-65535, not {port}")
    try:
        check_host(host, "its host")
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    import httpx  # the client that sends: it must take the URL as it is written

    try:
        url = httpx.URL(value)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ValueError(f"{what}: the HTTP client refuses it ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(what)
    return value


# where radserve POSTs (FHIR, critical receivers, the deadline-risk webhook)
HttpUrl = Annotated[str, AfterValidator(check_http_url)]


def check_header_value(value: SecretStr | None) -> SecretStr | None:
    """A token sent in an HTTP header: printable ASCII only. A CR/LF is a header
    injection (httpx refused it at every send, retried for ever as "cannot reach the
    receiver"); a non-ASCII character is refused by the client as well. The value is
    never quoted (it is a secret)."""
    if value is not None and not all(
        " " <= c <= "~" or c == "\t" for c in value.get_secret_value()
    ):
        raise ValueError(
            "must be printable ASCII: no line breaks (CR, LF), control or non-ASCII characters"
        )
    return value


HeaderSecret = Annotated[SecretStr | None, AfterValidator(check_header_value)]


class FhirSettings(_Section):
    """Where each job's FHIR R4 Bundle is POSTed (a ``transaction`` to the server's base
    URL), retried through the durable outbox. No ``url``: nothing is sent; the Bundle is
    still served at ``GET /v1/jobs/{id}/fhir``."""

    url: HttpUrl | None = None
    # sent as ``Authorization: Bearer <token>``; never logged, masked by ``config show``
    bearer_token: HeaderSecret = None
    timeout_s: PeerTimeout = 30.0
    # back-off: first wait, doubling up to the cap; a bundle still failing after
    # ``give_up_after_s`` is marked failed_permanent
    retry_first_s: RetryInterval = 30.0
    retry_max_s: RetryInterval = 3600.0
    give_up_after_s: Seconds = Field(default=72 * 3600.0, gt=0)
    # Patient.identifier.system of the DICOM Patient ID (radserve.report.fhir.patient):
    # ``issuer_systems`` maps an Issuer of Patient ID (0010,0021) to a system URI (OIDs
    # and URIs in the header are used as they are); ``patient_identifier_system`` is the
    # system of Patient IDs that name no issuer. Neither: no system, no conditional create.
    patient_identifier_system: str | None = Field(default=None, pattern=_SYSTEM_URI)
    issuer_systems: dict[str, Annotated[str, Field(pattern=_SYSTEM_URI)]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _retry_first_within_max(self) -> FhirSettings:
        _check_backoff(self.retry_first_s, self.retry_max_s)
        return self


class OutboxSettings(_Section):
    """The durable outbox shared by the DICOM and FHIR deliveries.

    A row being sent holds a 15-minute lease, so that when several servers (replicas)
    share one database, a row whose sender died is taken over by another. A sender
    raises it to twice its longest attempt (a peer's timeouts) where shorter, and renews
    it as a batch goes out (:mod:`radserve.gateway.lease_keeper`). ``replicas``
    says how many do: with 1 (the default) a server reclaims at start every row left
    ``sending``; with more, only the rows leased under its own ``instance_id`` (default:
    the host name; give each replica a stable, distinct one). On PostgreSQL one server
    at a time sends to each destination (a lock per destination, taken over when its
    holder stops or dies; ``lane_poll_s``). ``unreachable_after_s``:
    ``/readyz`` reports a destination whose oldest retrying delivery was queued longer
    ago (0: never): degraded (200), or not ready (503) with ``unreachable_is_not_ready``."""

    replicas: int = Field(default=1, ge=1)
    instance_id: str | None = Field(default=None, min_length=1, max_length=120)
    # how long a row being sent is its sender's without a renewal: after that another
    # replica sends it (at least twice the longest attempt, renewed before each send)
    lease_s: Seconds = Field(default=900.0, gt=0)
    # with replicas > 1: how often a destination's sender looks for deliveries other
    # replicas queued, and a replica not sending to it tries to take it over
    lane_poll_s: PollInterval = 5.0
    unreachable_after_s: Seconds = Field(default=900.0, ge=0)
    # False: /readyz stays 200 and says "degraded", naming the destination; True: 503
    unreachable_is_not_ready: bool = False


class SyslogSettings(_Section):
    """An audit record collector (IHE ATNA Audit Record Repository): every audit event
    is sent as RFC 5424 syslog over TLS (RFC 5425 octet counting) carrying a DICOM
    PS3.15 A.5 audit message (``format: dicom``) or a FHIR AuditEvent (``fhir``).

    ``tls.ca`` verifies the collector (system CAs when absent); ``tls.cert`` + ``key`` is
    the client certificate offered to it. Delivery reads the chain from the database
    after a cursor (``cursor_file``, default ``<data_dir>/audit/syslog.cursor``), so a
    collector that is down delays delivery, never a request, and nothing is lost."""

    host: HostName
    port: int = Field(default=6514, ge=1, le=65535)
    server_name: str | None = None  # TLS name to check (default: host)
    tls: TlsSettings = TlsSettings()
    format: Literal["dicom", "fhir"] = "dicom"
    app_name: str = Field(default="radserve", pattern=r"^[!-~]{1,48}$")
    cursor_file: Path | None = None
    timeout_s: PeerTimeout = 10.0
    retry_first_s: RetryInterval = 1.0
    retry_max_s: RetryInterval = 60.0
    poll_s: PollInterval = 2.0  # also picks up other processes' records

    @model_validator(mode="after")
    def _retry_first_within_max(self) -> SyslogSettings:
        _check_backoff(self.retry_first_s, self.retry_max_s)
        return self


class AuditSettings(_Section):
    """Tamper evidence for the audit chain (see docs/security.md).

    Records are HMAC-SHA256 chained with a key kept outside the database: ``key`` (64
    hex digits, e.g. ``RADSERVE_AUDIT__KEY``) or ``key_file`` (default
    ``<data_dir>/audit/audit.key``, created with mode 0600 at first start). Signed
    checkpoints of the head (count + head MAC) are appended to ``checkpoint_file``
    (default ``<data_dir>/audit/checkpoints.jsonl``) at most every
    ``checkpoint_interval_s`` while records are added, and at stop."""

    key: SecretStr | None = None
    key_file: Path | None = None
    checkpoint_file: Path | None = None
    checkpoint_interval_s: Seconds = Field(default=5.0, ge=0)
    syslog: SyslogSettings | None = None

    @field_validator("key")
    @classmethod
    def _hex_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value.get_secret_value()):
            raise ValueError("must be 64 hex digits (256 bits), e.g. `openssl rand -hex 32`")
        return value


class SecuritySettings(_Section):
    """Who may read whose studies. ``visibility``: ``all`` (every read key sees every
    job), ``own_submitter`` (a non-admin key sees the jobs submitted by keys with its
    ``submitter``, or by itself), ``site`` (the jobs of keys with its ``site``). Admin
    keys see everything; a job submitted over DICOM (no key) is seen by admins only
    unless ``visibility`` is ``all``."""

    visibility: Literal["all", "own_submitter", "site"] = "all"


class ConsoleUser(_Section):
    """One local console user: signs in with a user name and password instead of an API
    key. ``password_hash``: from ``radserve console hash-password`` (scrypt, per-user
    salt; radserve.passwords), never a clear password."""

    username: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,26}$")
    role: Literal["read", "submit", "admin"]
    password_hash: SecretStr
    # the user's scope under security.visibility, as a key's (`radserve keys create
    # --site/--submitter`): which jobs it sees, who sees its jobs and audit records
    site: str | None = None
    submitter: str | None = None

    @field_validator("site", "submitter")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        """A key's site and submitter's rule."""
        problem = None if value is None else label_problem(value)
        if problem is not None:
            raise ValueError(f"give one line of printable text, 1 to 128 characters: {problem}")
        return value

    @field_validator("password_hash")
    @classmethod
    def _scrypt_hash(cls, value: SecretStr) -> SecretStr:
        from radserve.passwords import PasswordHash

        PasswordHash.parse(value.get_secret_value())  # ValueError says what is wrong
        return value


class ConsoleSettings(_Section):
    """The web console served at ``/`` (radserve.console). Sign-in with an API key, or
    as one of ``users`` with a password, opens a server-side session (HttpOnly,
    SameSite=Strict cookie) that ends after ``session_ttl_s`` or ``idle_timeout_s``
    without a request, at sign-out, when the key is revoked, or when the user's account
    here changes or goes (sessions are in the store: every replica and a restarted
    server know them; ``radserve serve`` re-reads ``users`` when its settings file
    changes). A client with ``signin_max_failures`` failed sign-ins within
    ``signin_window_s`` (on all replicas) is refused (429) until the oldest leaves the
    window.
    ``phi_roles``: roles whose sessions see patient name, ID and birth date (read from
    the stored study, audited as phi.read)."""

    enabled: bool = True
    session_ttl_s: Seconds = Field(default=8 * 3600.0, gt=0)
    idle_timeout_s: Seconds = Field(default=3600.0, gt=0)
    phi_roles: tuple[Literal["read", "submit", "admin"], ...] = ("admin",)
    # None: Secure cookies exactly when the API is served over HTTPS (server.tls)
    secure_cookie: bool | None = None
    users: tuple[ConsoleUser, ...] = ()
    signin_max_failures: int = Field(default=5, ge=1)
    signin_window_s: Seconds = Field(default=300.0, gt=0)

    @field_validator("users")
    @classmethod
    def _unique_users(cls, users: tuple[ConsoleUser, ...]) -> tuple[ConsoleUser, ...]:
        names = [u.username.lower() for u in users]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"console user names must be unique (case-insensitive): {twice}")
        return users


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("radserve_config_file", default=None)


class GuardrailSettings(_Section):
    """When a canary is rolled back automatically (radserve.lifecycle.guardrails)."""

    auto_rollback: bool = True
    min_studies: int = Field(default=5, ge=1)  # canary jobs finished before judging
    max_failure_rate: float = Field(default=0.2, ge=0, le=1)
    max_p95_ratio: float = Field(default=3.0, gt=0)  # canary / stable p95 of the step's own s
    min_comparisons: int = Field(default=3, ge=1)
    min_lesion_agreement: float = Field(default=0.8, ge=0, le=1)
    min_dice: float = Field(default=0.8, ge=0, le=1)
    # a classification step: the share of compared studies answered as stable answered
    min_answer_agreement: float = Field(default=0.8, ge=0, le=1)


class DriftSettings(_Section):
    """Drift monitoring per model version (radserve.lifecycle.drift; docs/models.md).
    ``reference``: ``auto`` uses a reference file (``drift_reference.json`` in the
    bundle, else ``<data_dir>/drift/<model>/<version>.json``, e.g. built from phantoms by
    ``radserve models drift-reference``) and otherwise collects the first
    ``reference_studies`` studies served; ``file`` only the file; ``first_studies`` only
    the collection. Judged after every study once ``min_window`` are in the window."""

    enabled: bool = True
    reference: Literal["auto", "file", "first_studies"] = "auto"
    reference_studies: int = Field(default=30, ge=5)
    window: int = Field(default=20, ge=5)
    min_window: int = Field(default=20, ge=5)
    psi_warn: float = Field(default=0.1, gt=0)
    psi_alert: float = Field(default=0.25, gt=0)
    p_warn: float = Field(default=0.01, gt=0, lt=1)  # Bonferroni-divided by the tests made
    p_alert: float = Field(default=0.001, gt=0, lt=1)
    # another replica's window file untouched this long is a retired replica's: removed at
    # start (0: kept for ever). A live replica rewrites its own after every study.
    stale_window_days: Days = Field(default=30.0, ge=0)


class VariantBuildSettings(_Section):
    """``models install --build-variants`` (and ``POST /v1/models?build_variants=true``):
    precision variants built and gated as ``radserve models build-variants`` builds the
    shipped ones: INT8 calibrated on ``calibration_seeds`` phantoms, every precision
    evaluated through ``pipeline`` (default: the configured pipeline, else the first that
    runs the model) on the held-out ``seeds`` phantoms (full size unless ``small``)."""

    precisions: tuple[Literal["fp16", "int8", "bf16"], ...] | None = None  # None: host's
    seeds: str = "0-9"
    calibration_seeds: str = "1000-1003"
    small: bool = False
    pipeline: str | None = None
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)


class LifecycleSettings(_Section):
    """Model lifecycle in the running server (radserve.lifecycle; docs/models.md)."""

    poll_s: PollInterval = 2.0  # how often the deployments table is read
    # share (percent) of canary studies also run on stable afterwards, to compare them
    compare_canary_percent: float = Field(default=100.0, ge=0, le=100)
    # comparison runs waiting for an idle server, per version whose record they feed
    # (a canary's stable re-runs never crowd out a shadow's); later ones are skipped
    max_pending_comparisons: int = Field(default=8, ge=1)
    guardrails: GuardrailSettings = GuardrailSettings()
    drift: DriftSettings = DriftSettings()
    variants: VariantBuildSettings = VariantBuildSettings()


class SyslogTargetSettings(_Section):
    """An alert collector's syslog settings (a critical receiver of kind syslog,
    ``turnaround.risk_syslog``): RFC 5424 over TLS (RFC 5425; ``tls.ca`` verifies the
    collector) or, with ``transport: tcp``, plain TCP (RFC 6587 octet counting); no UDP:
    nothing would say a datagram arrived."""

    timeout_s: PeerTimeout = 10.0
    port: int | None = Field(default=None, ge=1, le=65535)  # default 6514 (tls), 514 (tcp)
    transport: Literal["tls", "tcp"] = "tls"
    tls: TlsSettings = TlsSettings()
    server_name: str | None = None
    app_name: str = Field(default="radserve", pattern=r"^[!-~]{1,48}$")
    facility: int = Field(default=16, ge=0, le=23)  # 16: local0

    @property
    def syslog_port(self) -> int:
        return self.port or (6514 if self.transport == "tls" else 514)


class RiskSyslogSettings(SyslogTargetSettings):
    """A syslog collector for deadline-risk alerts (``turnaround.risk_syslog``), set as a
    critical-finding syslog receiver is. Each raised or cleared risk is one message (job
    id, class, times; no patient data), sent on a thread of its own from a bounded queue,
    retried a few times."""

    host: HostName = Field(min_length=1)

    @model_validator(mode="after")
    def _tls_needs_tls(self) -> RiskSyslogSettings:
        if self.transport == "tcp" and "tls" in self.model_fields_set:
            raise ValueError("risk_syslog: tls settings need transport tls")
        return self


# the service-time prior's largest values, by radserve.turnaround.service_time.Prior's
# field names: turnaround.prior_<name> here, and a `radserve plan --service-times`
# file's prior (radserve.turnaround.model_file); each is at least 0
PRIOR_MAX: dict[str, float] = {"fixed_s": 3600, "per_slice_s": 60, "device_share": 1}


class TurnaroundSettings(_Section):
    """ETAs, deadline-risk events and the service-time model (radserve.turnaround)."""

    # a job is at risk when its predicted finish passes its deadline minus this margin
    risk_margin_s: Seconds = Field(default=10.0, ge=0)
    # a risk is cleared when the predicted finish is back before deadline - margin - this
    # (hysteresis: a prediction hovering at the threshold neither raises nor clears again)
    risk_clear_s: Seconds = Field(default=15.0, ge=0)
    # what the scheduler does for a job at risk: nothing more than the alert; promote: run
    # it ahead of the other work of its (effective) class; reserve: also hold the next
    # free routine slot for it while it waits, ahead of every job of its own class or a
    # lower one (aged or not), never of a better class or URGENT (Scheduler.reserve)
    risk_policy: Literal["none", "promote", "reserve"] = "none"
    # optional alert receiver: a JSON POST per risk event (retried, never blocking)
    risk_webhook_url: HttpUrl | None = None
    # optional alert receiver: an RFC 5424 syslog message per risk event (likewise)
    risk_syslog: RiskSyslogSettings | None = None
    # at stop, alerts still queued get this long to go out (one attempt each); the rest
    # are counted (radserve_deadline_risk_alerts_dropped_total), logged and audited
    risk_alert_grace_s: Seconds = Field(default=3.0, ge=0, le=60)
    # ETAs are recomputed after scheduling events, at most this often
    recompute_interval_s: PollInterval = 0.5
    # succeeded jobs read back at start to learn service times from
    history_jobs: int = Field(default=200, ge=0, le=1000)
    # ETAs scaled per class by the median actual/predicted time to finish of this many
    # recent finished jobs (radserve.turnaround.bias); 0 (default): no correction. Off
    # since 2026-12-02: replayed on three recorded traces it made the halfway ETAs of
    # jobs queued behind >= 3 others 2-3x worse and helped at submission in one of three
    # (README, issue 17); session 16: on the twelve kept traces no keying of it (class,
    # depth, horizon; median or mean; minimum counts) lowered the median error
    # (docs/history/turnaround.md)
    bias_window_jobs: int = Field(default=0, ge=0, le=1000)
    # the band's late end (predicted_finish_late, meant as a 90th percentile): "own", the
    # walk's (the overtaking arrivals' Poisson 90th percentile plus the job's service-time
    # noise), or "conformal", the 90th percentile of the last band_window_jobs finished
    # jobs' actual / predicted time to finish from their first ETA (radserve.turnaround.
    # conformal; the walk's own until 3 have finished since the start). Replayed on the
    # sixteen kept traces, the deep jobs' finishes it held: own 81 %, conformal 89 %
    # (docs/turnaround.md); deadline-risk events read predicted_finish, not the band
    band: Literal["own", "conformal"] = "conformal"
    band_window_jobs: int = Field(default=20, ge=3, le=1000)
    # the service-time model: the last this many succeeded jobs per step, each weighted
    # by recency (a job half_life_jobs old counts half; 0: all alike), and the job's
    # start-to-finish time learned per lane (radserve.turnaround.eta.latency_lane): none, per
    # class, or exclusive (default since 2026-12-02 session 9: URGENT runs alone under
    # urgent_exclusive, routine work shares the cores; replayed on five loaded-host traces
    # it had the lowest median error of the variants not worse halfway, but was worse on
    # two of them: README, issue 17)
    window_jobs: int = Field(default=200, ge=1, le=1000)
    half_life_jobs: float = Field(default=0.0, ge=0)
    latency_lanes: Literal["none", "class", "exclusive"] = "exclusive"
    # the ETA walk's throughput bound: "shares", the jobs' measured shares of the server's
    # wall time (radserve.turnaround.share; default since 2026-12-02 session 10), or
    # "stages", their stage timings over the workers and cores (before; on five loaded
    # traces: better on three, worse on two, README, issue 17)
    throughput: Literal["shares", "stages"] = "shares"
    # a running job's share left in the walk's throughput bound: its estimated share less
    # the share it has had ("measured", default since session 11), or in proportion to its
    # latency left ("latency", before); and whether a queued job also counts the shares
    # left of running jobs ranked behind it (they are not preempted; off: on four traces
    # better on one, worse on two). With the rates below, replayed on two quiet-host
    # traces: 42.2 / 32.6 % -> 20.0 / 23.5 % error behind >= 3 (README, issue 17)
    # ("progress", session 30: by its stage seconds so far against its estimated work)
    share_left: Literal["measured", "latency", "progress"] = "measured"
    running_behind: bool = False
    # the overtaking allowance on the latency chain of a job that starts at once: none
    # ("waiting", since session 32: its learned run time already holds what overtaking
    # did to jobs of its kind), or added as for every job ("always", before)
    chain_allowance: Literal["waiting", "always"] = "waiting"
    # the allowance's arrival rates per class: counted over the last hour, or while the
    # server has seen less, since its first arrival (at least arrival_min_span_s), with
    # arrival_prior pseudo-arrivals per class (radserve.turnaround.rates; since session
    # 11: the span since the server's start, at least 60 s, made the rates 3-7x low)
    arrival_min_span_s: Seconds = Field(default=10.0, gt=0)
    # at most 100: more drowns every counted rate (1e300 was taken)
    arrival_prior: float = Field(default=1.0, ge=0, le=100)
    # the service-time prior (before anything is measured): seconds = fixed + per_slice
    # x slices for a job, device_share of it in model batches (README bench figures)
    # (at most an hour a study and a minute a slice: 100x the slowest CPU measured;
    # a prior of 1e300 s a slice was taken and every waiting job's ETA read 9999-12-31)
    prior_fixed_s: Seconds = Field(default=0.5, ge=0, le=PRIOR_MAX["fixed_s"])
    prior_per_slice_s: Seconds = Field(default=0.017, ge=0, le=PRIOR_MAX["per_slice_s"])
    prior_device_share: float = Field(default=0.5, ge=0, le=PRIOR_MAX["device_share"])


class CriticalReceiverSettings(SyslogTargetSettings):
    """One receiver of critical-finding notices (radserve.critical), by ``kind``:

    - ``webhook`` (default): the JSON notice POSTed to ``url``; its 2xx acknowledges it.
    - ``syslog``: the notice as an RFC 5424 message (severity alert) to ``host``:``port``
      over TLS (RFC 5425; ``tls.ca`` verifies the collector) or, with ``transport: tcp``,
      plain TCP; delivered = written to the connected stream (syslog has no
      acknowledgement). No UDP: nothing would say a datagram arrived.
    - ``fhir``: a FHIR R4 transaction Bundle (the job's Patient, ImagingStudy,
      DiagnosticReport ... and a Communication, category alert, priority stat; with
      ``flag: true`` also a Flag) POSTed to ``url`` (default: ``fhir.url``, its token
      ``fhir.bearer_token``); its 2xx acknowledges it. It names the patient: send it only
      to a clinical system."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    kind: Literal["webhook", "syslog", "fhir"] = "webhook"
    url: HttpUrl | None = None
    # sent as ``<auth_header>: <auth_scheme> <token>``; never logged, masked by ``config show``
    token: HeaderSecret = None
    auth_header: str = Field(default="Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    auth_scheme: str = Field(default="Bearer", pattern=r"^[A-Za-z0-9-]{0,32}$")
    # syslog: host, and the fields of SyslogTargetSettings
    host: HostName | None = Field(default=None, min_length=1)
    # fhir: also a Flag on the patient
    flag: bool = False

    @model_validator(mode="after")
    def _fields_of_kind(self) -> CriticalReceiverSettings:
        syslog_only = {"host", "port", "transport", "tls", "server_name", "app_name", "facility"}
        own = {
            "webhook": {"url", "token", "auth_header", "auth_scheme"},
            "syslog": syslog_only,
            "fhir": {"url", "token", "flag"},
        }[self.kind]
        stray = sorted((self.model_fields_set - own) - {"name", "kind", "timeout_s"})
        if stray:
            raise ValueError(
                f"receiver {self.name!r} (kind {self.kind}) does not take {stray}; "
                f"a {self.kind} receiver takes {sorted(own)}"
            )
        if self.kind == "webhook" and self.url is None:
            raise ValueError(f"webhook receiver {self.name!r} needs a url")
        if self.kind == "syslog" and self.host is None:
            raise ValueError(f"syslog receiver {self.name!r} needs a host")
        if self.transport == "tcp" and "tls" in self.model_fields_set:
            raise ValueError(f"syslog receiver {self.name!r}: tls settings need transport tls")
        return self


class CriticalSettings(_Section):
    """Critical findings pushed to ``receivers`` the moment a job's result is recorded,
    before its SEG/SR/FHIR deliveries, and re-sent until acknowledged (never given up by
    age). A finding is critical when it meets one of ``rules`` or of its pipeline's own
    ``critical:`` rules (radserve.domain.critical). No receivers: nothing is pushed."""

    receivers: tuple[CriticalReceiverSettings, ...] = ()
    rules: tuple[CriticalRule, ...] = ()
    # back-off between attempts: first wait, doubling up to the cap
    retry_first_s: RetryInterval = 2.0
    retry_max_s: RetryInterval = 60.0

    @model_validator(mode="after")
    def _unique_receivers(self) -> CriticalSettings:
        # ignoring case: "Ward" and "ward" are one name to a person reading the audit,
        # the metrics' receiver label and the outbox's destination list
        names = [r.name.lower() for r in self.receivers]
        twice = sorted({r.name for r in self.receivers if names.count(r.name.lower()) > 1})
        if twice:
            raise ValueError(
                f"receiver names must be unique (ignoring case); repeated: {', '.join(twice)}"
            )
        return self

    @model_validator(mode="after")
    def _retry_first_within_max(self) -> CriticalSettings:
        _check_backoff(self.retry_first_s, self.retry_max_s)
        return self


def _check_backoff(first_s: float, max_s: float) -> None:
    """A back-off's first wait may not exceed its cap (it starts at the first wait and
    doubles up to the cap: an inverted pair silently waited the cap every time)."""
    if first_s > max_s:
        raise ValueError(
            f"retry_first_s ({first_s:g} s) must not be more than retry_max_s ({max_s:g} s)"
        )


class _FileSource(PydanticBaseSettingsSource):
    """The parsed config file (set by :func:`load_settings`) as a settings source."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return _FILE_DATA.get() or {}


class Settings(BaseSettings):
    """Everything the server is configured with. Frozen: build once, pass it in."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        allow_inf_nan=False,
    )

    data_dir: Path = Path("data")
    # SecretStr: a PostgreSQL URL carries a password. None: SQLite file in data_dir.
    database_url: SecretStr | None = None
    server: ServerSettings = ServerSettings()
    jobs: JobSettings = JobSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    # first match wins, none: OUTPATIENT; default STAT -> URGENT, HIGH -> INPATIENT
    # (radserve.domain.priority.DEFAULT_RULES); attributes checked against the dictionary
    priority_rules: PriorityRules = PriorityRules()
    models: ModelsSettings = ModelsSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    # inprocess: worker threads of this process; ray: one Ray actor per device (RaySettings)
    executor: Literal["inprocess", "ray"] = "inprocess"
    ray: RaySettings = RaySettings()
    storage: StorageSettings = StorageSettings()
    pipelines: PipelinesSettings = PipelinesSettings()
    ingest: IngestSettings = IngestSettings()
    gateway: GatewaySettings = GatewaySettings()
    dicomweb: DicomwebSettings = DicomwebSettings()
    fhir: FhirSettings = FhirSettings()
    results: ResultsSettings = ResultsSettings()
    outbox: OutboxSettings = OutboxSettings()
    audit: AuditSettings = AuditSettings()
    security: SecuritySettings = SecuritySettings()
    console: ConsoleSettings = ConsoleSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    turnaround: TurnaroundSettings = TurnaroundSettings()
    critical: CriticalSettings = CriticalSettings()

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_values(cls, value: Any, info: ValidationInfo) -> Any:
        return _refuse_lax_value(cls, info.field_name, value)

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # absolute once, so workers with another working directory see the same folder
        return value.expanduser().absolute()

    @model_validator(mode="after")
    def _critical_fhir_url(self) -> Settings:
        for receiver in self.critical.receivers:
            if receiver.kind == "fhir" and receiver.url is None and self.fhir.url is None:
                raise ValueError(
                    f"critical receiver {receiver.name!r} (kind fhir) needs a url, or "
                    "fhir.url to fall back on"
                )
        return self

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not _DB_URL.match(value.get_secret_value()):
            raise ValueError("must be sqlite:///FILE or postgresql+psycopg://USER@HOST/DB")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @property
    def effective_database_url(self) -> str:
        """The database URL in clear (for the engine only; never log it)."""
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{self.data_dir / SQLITE_FILE_NAME}"

    def display_dict(self) -> dict[str, Any]:
        """JSON-able settings with secrets masked: what ``radserve config show`` prints."""
        # every http(s) URL too (receivers, risk_webhook_url, fhir.url): a password or a
        # token in its query was printed whole
        data = _mask_urls(self.model_dump(mode="json", by_alias=True))
        data["database_url"] = mask_url(self.effective_database_url)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.display_dict(), sort_keys=False)

    def fingerprint(self) -> str:
        """SHA-256 of the masked settings: lets the audit log record configuration changes."""
        canonical = json.dumps(self.display_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def mask_url(url: str) -> str:
    """Hide the password in a database URL (userinfo and ``password=`` query parameters)."""
    url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


_HTTP_URL_TEXT = re.compile(r"(?i)^https?://")


def mask_http_url(url: str) -> str:
    """Hide what may be a credential in an http(s) URL: the userinfo and every query
    value (``?apikey=...``), keeping scheme, host, path and query keys (what an operator
    needs to tell which receiver it is); the logs' own rule (:func:`redact_url`)."""
    return redact_url(url)


def _mask_urls(value: Any) -> Any:
    """``value`` (dumped settings, an echoed input) with every http(s) URL's credentials
    masked (:func:`mask_http_url`), at any depth."""
    if isinstance(value, dict):
        return {k: _mask_urls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_mask_urls(v) for v in value)
    if isinstance(value, str) and _HTTP_URL_TEXT.match(value):
        return mask_http_url(value)
    return value


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build the settings from overrides > environment > config file > defaults.

    ``config_file`` defaults to ``$RADSERVE_CONFIG``. Overrides use ``__`` for nesting
    (``server__port=9000``); ``None`` values are skipped, so unset CLI flags change nothing.
    """
    path = config_file if config_file is not None else os.environ.get(CONFIG_ENV) or None
    file_data = _read_config_file(Path(path)) if path is not None else {}
    _check_environment()
    init = _nest({k: v for k, v in overrides.items() if v is not None})
    token = _FILE_DATA.set(file_data)
    try:
        return Settings(**init)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source=str(path) if path else None)) from None
    except SettingsError as exc:
        # an environment value of a list or section that is not JSON: pydantic-settings
        # raises this (not a ValidationError), and it ended every command in a traceback
        raise ConfigError(_describe_environment(exc)) from None
    finally:
        _FILE_DATA.reset(token)


def _read_config_file(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(read_utf8(path))
        elif suffix in (".yaml", ".yml"):
            data = load_yaml_file(path)
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml or .toml")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings at the top level")
    # YAML keys may be anything (null, numbers): pydantic names a nested one, but a
    # top-level one became a keyword argument and a TypeError (found by fuzzing)
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        raise ConfigError(
            f"config file {path}: setting names must be text; found {quoted(odd[0])} "
            f"({type(odd[0]).__name__})"
        )
    return data


def _check_environment() -> None:
    """Top-level ``RADSERVE_*`` names that are no setting (nested ones pydantic rejects)."""
    known = set(Settings.model_fields)
    for name in os.environ:
        if not name.upper().startswith(ENV_PREFIX) or _NOT_SETTINGS.match(name):
            continue
        key = name[len(ENV_PREFIX) :].split("__", 1)[0].lower()
        if key not in known:
            hint = _did_you_mean(key, known)
            raise ConfigError(f"unknown setting {key!r} from environment variable {name}{hint}")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split("__")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _did_you_mean(key: str, known: set[str] | list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def _known_at(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the settings section at ``loc`` (for "did you mean"); list items
    (``priority_rules.0``) and root models (:class:`PriorityRules`) are looked through."""
    model: Any = Settings
    for part in loc:
        model = _unwrap(model)
        if isinstance(part, int):
            args = [a for a in get_args(model) if a is not Ellipsis]
            if not args:
                return []
            model = args[0]
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    model = _unwrap(model)
    return [f.alias or name for name, f in getattr(model, "model_fields", {}).items()]


def _unwrap(model: Any) -> Any:
    """A root model's root type (``PriorityRules`` -> ``tuple[PriorityRule, ...]``)."""
    if isinstance(model, type) and issubclass(model, RootModel):
        return model.model_fields["root"].annotation
    return model


# the unit of a number setting named as a duration, by its name's end ("_bytes_s" is a rate)
DURATION_UNITS_S = {"_s": 1.0, "_ms": 1e-3, "_days": 86_400.0}


@dataclass(frozen=True)
class NumberSetting:
    """One int or float setting: its dotted path, type, field and, when it is a duration
    (named so, or a class TAT), the seconds in one of its units."""

    path: str
    kind: type
    field: FieldInfo
    unit_s: float | None


def number_settings(
    model: type[BaseModel] | None = None, prefix: str = ""
) -> Iterator[NumberSetting]:
    """Every number setting, through the nested sections (optional ones too): what the
    tests of the duration bound and ``tools/settings_extremes.py`` walk."""
    for name, field in (model or Settings).model_fields.items():
        candidates = [field.annotation]
        if get_origin(field.annotation) in (Union, UnionType):
            candidates = list(get_args(field.annotation))
        nested = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nested is not None and not issubclass(nested, RootModel):
            yield from number_settings(nested, f"{prefix}{name}.")
            continue
        kind = next((c for c in candidates if c in (int, float)), None)
        if kind is None:
            continue
        unit = next((u for end, u in DURATION_UNITS_S.items() if name.endswith(end)), None)
        if name.endswith("_bytes_s"):
            unit = None
        if model is ClassTats:
            unit = 1.0
        yield NumberSetting(prefix + name, kind, field, unit)


# settings whose wrong values are not echoed in errors (a clear password typed where its
# hash belongs, a URL with a password, a token or key): matched in the setting's name,
# besides every SecretStr field of the settings (_secret_names)
_SECRET_WORDS = ("database_url", "password", "token", "key", "secret")
MASKED = "***"


@functools.cache
def _secret_names() -> frozenset[str]:
    """Names (and aliases) of every SecretStr field in the settings, through the nested
    sections, lists and optional ones: a secret added later is masked without a word here."""
    names: set[str] = set()
    seen: set[type] = set()

    def has_secret(annotation: Any) -> bool:
        if annotation is SecretStr:
            return True
        return any(has_secret(arg) for arg in get_args(annotation))

    def models_in(annotation: Any) -> Iterator[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for arg in get_args(annotation):
            yield from models_in(arg)

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if has_secret(field.annotation):
                names.update(n.lower() for n in (name, field.alias) if n)
            for nested in models_in(field.annotation):
                walk(nested)

    walk(Settings)
    return frozenset(names)


def _is_secret(name: object) -> bool:
    """Whether a setting of this name (a location part or a key in an echoed input) holds
    a secret."""
    text = str(name).lower()
    return text in _secret_names() or any(word in text for word in _SECRET_WORDS)


def _masked(value: Any) -> Any:
    """``value`` with the values of secret keys replaced, at any depth: a model-level
    error (a duplicate critical receiver, a fhir receiver without url) echoes the whole
    section or file as its input, tokens and passwords included."""
    if isinstance(value, dict):
        return {k: MASKED if _is_secret(k) else _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_masked(v) for v in value)
    if isinstance(value, SecretStr):
        return MASKED
    return _mask_urls(value)


def _describe(exc: ValidationError, *, source: str | None) -> str:
    """One line per problem, naming the setting; secret values are never echoed."""
    where = f" (config file {source}, environment or overrides)" if source else ""
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        dotted = ".".join(str(p) for p in loc)
        if error["type"] == "extra_forbidden":
            parent = "".join(f"{p}." for p in loc[:-1])
            hint = _did_you_mean(str(loc[-1]), _known_at(loc[:-1]), parent)
            lines.append(f"unknown setting {dotted!r}{hint}")
        elif not loc:
            # a check across sections (a fhir receiver and fhir.url): its message names
            # the settings; its input is every setting given, not worth echoing, and an
            # empty name read "invalid setting ''"
            lines.append(f"invalid settings: {_message(error)}")
        else:
            # any part: a union member's tag or a list index may follow the secret's name
            secret = any(_is_secret(part) for part in loc if isinstance(part, str))
            shown = "" if secret else f" (got {_masked(error.get('input'))!r})"
            lines.append(f"invalid setting {dotted!r}: {_message(error)}{shown}")
    return f"configuration error{where}: " + "; ".join(lines)


# what each pattern-checked setting takes, in words: pydantic's message quotes the regex,
# which says little to an operator, and the CLI's redaction of PN-like "a^b" tokens
# turned its "^" into "<redacted>" (String should match pattern '<redacted>[...]+$')
PATTERN_WORDS = {
    _SYSTEM_URI: "an absolute URI such as urn:oid:1.2.3 or https://example.org/ids",
    r"^[!-~]{1,48}$": "1-48 printable ASCII characters, no spaces",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,26}$": (
        "1-27 letters, digits, dots, underscores or hyphens, starting with a letter or digit"
    ),
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$": (
        "1-64 letters, digits, dots, underscores or hyphens, starting with a letter or digit "
        "(no spaces)"
    ),
    r"^[A-Za-z0-9-]{1,64}$": "an HTTP header name: 1-64 letters, digits or hyphens",
    r"^[A-Za-z0-9-]{0,32}$": "at most 32 letters, digits or hyphens (empty: no scheme)",
    r"^(cpu|gpu)(:\d+(\.\d+)?)?(@[A-Za-z0-9_.-]+)?$": (
        "cpu or gpu, optionally :COUNT and @NODE (e.g. gpu:1, cpu:4@node-2)"
    ),
}


def _message(error: Any) -> str:
    """pydantic's message for one error, a pattern mismatch said in words
    (:data:`PATTERN_WORDS`)."""
    return problem_message(error, PATTERN_WORDS)


def _describe_environment(exc: SettingsError) -> str:
    """The ``RADSERVE_*`` variable whose value had to be JSON (a list or a section) and is
    not, with an example of the JSON it takes; its value is not echoed (it may be a secret)."""
    for name, value in sorted(os.environ.items()):
        if not name.upper().startswith(ENV_PREFIX) or _NOT_SETTINGS.match(name):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        annotation = _annotation_at(path)
        if annotation is None or not _is_complex(annotation):
            continue
        try:
            json.loads(value)
        except ValueError:
            # the example is made of the words written, unless they may be a secret
            words = "" if any(_is_secret(part) for part in path) else value
            return (
                f"configuration error: environment variable {name} must be JSON: "
                f"{_json_example(annotation, words)}"
            )
    found = re.search(r'field "([^"]+)"', str(exc))
    field = found.group(1) if found else "?"
    return (
        f"configuration error: an environment variable {ENV_PREFIX}{field.upper()}__... holds "
        'a list or section that is not JSON; write it as JSON, e.g. \'["a", "b"]\' or '
        '\'{"name": "value"}\''
    )


def _annotation_at(path: list[str]) -> Any:
    """The type of the setting at ``path`` (lower-case names; list items looked through),
    or None where no setting is."""
    annotation: Any = Settings
    for part in path:
        model = next(
            (
                m
                for m in (_unwrap(a) for a in (annotation, *_items(annotation)))
                if isinstance(m, type) and issubclass(m, BaseModel)
            ),
            None,
        )
        if model is None:
            return None
        field = next(
            (
                f
                for n, f in model.model_fields.items()
                if part in (n.lower(), (f.alias or "").lower())
            ),
            None,
        )
        if field is None:
            return None
        annotation = field.annotation
    return annotation


def _items(annotation: Any) -> tuple[Any, ...]:
    """The members of an optional or a union, and the item types of a list or tuple."""
    return tuple(a for a in get_args(annotation) if a is not Ellipsis and a is not type(None))


def _is_complex(annotation: Any) -> bool:
    """Whether an environment value for this type is parsed as JSON (a list, a mapping, a
    section), as pydantic-settings decides."""
    annotation = _unwrap(annotation)
    if get_origin(annotation) in (Union, UnionType):
        return any(_is_complex(a) for a in _items(annotation))
    if get_origin(annotation) is Annotated:
        return _is_complex(get_args(annotation)[0])
    if get_origin(annotation) in (list, tuple, set, frozenset, dict):
        return True
    return isinstance(annotation, type) and issubclass(annotation, BaseModel | dict | list | tuple)


def _json_example(annotation: Any, value: str) -> str:
    """How to write ``value`` for a setting of this type: a JSON list built from the
    comma-separated words for a list of names, else what the list or object holds."""
    annotation = _unwrap(annotation)
    if get_origin(annotation) in (Union, UnionType):
        annotation = next(a for a in _items(annotation) if _is_complex(a))
    annotation = _unwrap(annotation)
    if get_origin(annotation) in (list, tuple, set, frozenset):
        item = _unwrap(next(iter(_items(annotation)), str))
        if isinstance(item, type) and issubclass(item, BaseModel):
            return f"a JSON list of objects with the fields {', '.join(item.model_fields)}"
        words = [w.strip() for w in value.split(",") if w.strip()] or ["..."]
        return f"a JSON list, e.g. {json.dumps(words)!r}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"a JSON object with (some of) the fields {', '.join(annotation.model_fields)}"
    return 'a JSON object, e.g. \'{"name": "value"}\''
