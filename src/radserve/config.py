"""One typed, frozen settings object for the whole server, built once and passed in.

Sources, highest precedence first: explicit overrides (command-line flags) ->
``RADSERVE_*`` environment variables (``__`` separates nesting levels, e.g.
``RADSERVE_SERVER__PORT=9000``) -> an optional YAML or TOML file (``--config`` or
``RADSERVE_CONFIG``) -> defaults. Unknown keys are errors from every source, because a
misspelt setting that is silently ignored is a setting that silently does not apply.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import tomllib
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from radserve.errors import RadserveError

ENV_PREFIX = "RADSERVE_"
CONFIG_ENV = "RADSERVE_CONFIG"
# RADSERVE_* variables that are not settings: the config file path, test and training tools.
_NOT_SETTINGS = re.compile(r"^RADSERVE_(CONFIG|TEST_.*|TRAIN_.*)$", re.IGNORECASE)
SQLITE_FILE_NAME = "radserve.db"
_DB_URL = re.compile(r"^(sqlite|postgres|postgresql)(\+\w+)?://", re.IGNORECASE)


class ConfigError(RadserveError):
    """The configuration cannot be loaded: unknown key, bad value, unreadable file."""

    code = "config_invalid"


class PriorityClass(StrEnum):
    """Clinical priority classes; the value is what the database and the API carry."""

    URGENT = "URGENT"
    INPATIENT = "INPATIENT"
    OUTPATIENT = "OUTPATIENT"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    metrics_require_key: bool = False
    max_upload_bytes: int = Field(default=2 * 1024**3, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)


class JobSettings(_Section):
    # from the job's start
    timeout_s: float = Field(default=900.0, gt=0)
    # extra attempts after a retryable failure (errors with ``retryable=True``)
    max_retries: int = Field(default=2, ge=0)
    retry_backoff_s: float = Field(default=5.0, ge=0)


class _PerClass(_Section):
    def for_class(self, priority_class: PriorityClass | str) -> Any:
        """The value for one class (``URGENT`` -> field ``urgent``)."""
        return getattr(self, PriorityClass(priority_class).value.lower())


class ClassTats(_PerClass):
    """Turnaround targets in seconds; deadline = arrival + the class's TAT."""

    urgent: float = Field(default=0.0, ge=0)
    inpatient: float = Field(default=300.0, ge=0)
    outpatient: float = Field(default=1800.0, ge=0)


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
    tat_s: ClassTats = ClassTats()
    queue_limits: QueueLimits = QueueLimits()
    # a routine job is promoted one class once its slack < aging_fraction x its TAT
    aging_fraction: float = Field(default=0.25, ge=0, le=1)
    max_batch_size: int = Field(default=32, ge=1)
    # how long a routine batch may wait for a compatible one (URGENT never waits)
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    # consecutive device failures that open a model's circuit breaker
    breaker_threshold: int = Field(default=3, ge=1)


class PriorityRule(_Section):
    """Map a DICOM attribute value to a class, e.g. RequestedProcedurePriority STAT -> URGENT."""

    attribute: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$")
    values: tuple[str, ...] = Field(min_length=1)
    priority_class: PriorityClass = Field(alias="class")


DEFAULT_PRIORITY_RULES: tuple[PriorityRule, ...] = tuple(
    PriorityRule.model_validate(
        {"attribute": "RequestedProcedurePriority", "values": [value], "class": klass}
    )
    for value, klass in (("STAT", "URGENT"), ("HIGH", "INPATIENT"))
)


class ModelsSettings(_Section):
    # extra bundle roots, searched before the bundled models
    dirs: tuple[Path, ...] = ()
    precision: Literal["fp32", "fp16", "int8", "bf16"] | None = None


class RuntimeSettings(_Section):
    """Which ONNX Runtime providers serve, in order (empty: the host's best, TensorRT >
    CUDA > OpenVINO > CPU), and the CPU threads (empty: the usable cores). A provider
    named here that the installed onnxruntime lacks stops the server with a reason."""

    providers: tuple[str, ...] = ()
    threads: int | None = Field(default=None, ge=1)


class PipelinesSettings(_Section):
    dirs: tuple[Path, ...] = ()
    default: str = "ct-chest-abdomen"


class IngestSettings(_Section):
    """Defaults for :class:`radserve.ingest.IngestPolicy` (same names, same meaning)."""

    missing_slices: Literal["reject", "flag", "resample"] = "reject"
    nonuniform_spacing: Literal["reject", "flag", "resample"] = "reject"
    gantry_tilt: Literal["reject", "flag", "correct"] = "reject"
    duplicate_positions: Literal["reject", "drop_identical", "keep_first"] = "drop_identical"
    mixed_orientation: Literal["split", "reject"] = "split"
    mismatched_dimensions: Literal["split", "reject"] = "split"
    localizers: Literal["drop", "reject"] = "drop"
    missing_slice_factor: float = 1.5
    spacing_tolerance: float = 0.02
    tilt_tolerance_deg: float = 0.5
    ct_padding_hu: float = -1000.0
    other_padding_value: float = 0.0

    def to_policy(self) -> Any:
        """The ingest policy these settings describe (imported lazily: ingest is heavy)."""
        from radserve.ingest.policy import IngestPolicy

        return IngestPolicy(**self.model_dump())


class DicomPeer(_Section):
    ae_title: str = Field(min_length=1, max_length=16)
    host: str
    port: int | None = Field(default=None, ge=1, le=65535)


class GatewaySettings(_Section):
    """DICOM network gateway (placeholder; its behaviour arrives with the gateway issue)."""

    enabled: bool = False
    ae_title: str = Field(default="RADSERVE", min_length=1, max_length=16, pattern=r"^[ -\[\]-~]+$")
    port: int = Field(default=11112, ge=0, le=65535)
    allowed_peers: tuple[DicomPeer, ...] = ()


class ResultsSettings(_Section):
    """What goes into the DICOM results (SEG + TID 1500 SR always, when any are written).

    ``secondary_capture_key_images`` adds each PNG key image as an RGB Secondary Capture
    in its own series of the source study, for viewers without SEG support."""

    secondary_capture_key_images: bool = False


class DicomwebSettings(_Section):
    """DICOMweb (STOW-RS in, WADO-RS of results out) under ``/dicomweb``.

    ``completeness``: ``request`` makes each STOW-RS request a complete study (one job
    per Study Instance UID in it, started at once); ``quiet`` files the instances and
    starts the job once the study has had no new instance for ``quiet_s`` seconds (for
    senders that split a study over several requests). A request may choose with
    ``?complete=true|false``."""

    completeness: Literal["request", "quiet"] = "request"
    quiet_s: float = Field(default=10.0, gt=0)


class FhirSettings(_Section):
    """Where each job's FHIR R4 Bundle is POSTed (a ``transaction`` to the server's base
    URL), retried through the durable outbox. No ``url``: nothing is sent; the Bundle is
    still served at ``GET /v1/jobs/{id}/fhir``."""

    url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    # sent as ``Authorization: Bearer <token>``; never logged, masked by ``config show``
    bearer_token: SecretStr | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    # back-off: first wait, doubling up to the cap; a bundle still failing after
    # ``give_up_after_s`` is marked failed_permanent
    retry_first_s: float = Field(default=30.0, gt=0)
    retry_max_s: float = Field(default=3600.0, gt=0)
    give_up_after_s: float = Field(default=72 * 3600.0, gt=0)


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("radserve_config_file", default=None)


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
    )

    data_dir: Path = Path("data")
    # SecretStr: a PostgreSQL URL carries a password. None: SQLite file in data_dir.
    database_url: SecretStr | None = None
    server: ServerSettings = ServerSettings()
    jobs: JobSettings = JobSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    priority_rules: tuple[PriorityRule, ...] = DEFAULT_PRIORITY_RULES
    models: ModelsSettings = ModelsSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    pipelines: PipelinesSettings = PipelinesSettings()
    ingest: IngestSettings = IngestSettings()
    gateway: GatewaySettings = GatewaySettings()
    dicomweb: DicomwebSettings = DicomwebSettings()
    fhir: FhirSettings = FhirSettings()
    results: ResultsSettings = ResultsSettings()

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # absolute once, so workers with another working directory see the same folder
        return value.expanduser().absolute()

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
        data = self.model_dump(mode="json", by_alias=True)
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
    finally:
        _FILE_DATA.reset(token)


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings at the top level")
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
    """Field names of the settings section at ``loc`` (for "did you mean")."""
    model: Any = Settings
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return [f.alias or name for name, f in getattr(model, "model_fields", {}).items()]


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
        else:
            shown = "" if "database_url" in dotted else f" (got {error.get('input')!r})"
            lines.append(f"invalid setting {dotted!r}: {error['msg']}{shown}")
    return f"configuration error{where}: " + "; ".join(lines)
