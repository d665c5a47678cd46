"""Settings: defaults, env prefix and nesting, YAML/TOML files, unknown keys, overrides,
frozen, masking, and ``radserve config show``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from radserve.commands.config import group as config_cli
from radserve.config import (
    ConfigError,
    PriorityClass,
    Settings,
    load_settings,
    mask_url,
)
from radserve.gateway import destinations


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No RADSERVE_* settings from the machine running the tests; cwd in a scratch dir."""
    for name in list(os.environ):
        if name.upper().startswith("RADSERVE_") and not name.upper().startswith("RADSERVE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    s = load_settings()
    assert s.data_dir == tmp_path / "data" and s.data_dir.is_absolute()
    assert s.effective_database_url == f"sqlite:///{tmp_path / 'data' / 'radserve.db'}"
    assert s.server.host == "127.0.0.1" and s.server.metrics_require_key is False
    tats = s.scheduler.tat_s
    assert [tats.for_class(c) for c in PriorityClass] == [60, 300, 1800]
    assert s.scheduler.queue_limits.for_class("URGENT") is None
    rules = [(r.attribute, r.values, r.priority_class) for r in s.priority_rules]
    assert rules == [
        ("RequestedProcedurePriority", ("STAT",), PriorityClass.URGENT),
        ("RequestedProcedurePriority", ("HIGH",), PriorityClass.INPATIENT),
    ]
    assert s.gateway.ae_title == "RADSERVE" and not s.gateway.enabled


def test_environment_with_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADSERVE_SERVER__PORT", "9001")
    monkeypatch.setenv("RADSERVE_SCHEDULER__TAT_S__INPATIENT", "120")
    monkeypatch.setenv("RADSERVE_SERVER__METRICS_REQUIRE_KEY", "true")
    monkeypatch.setenv("RADSERVE_DATA_DIR", "/srv/radserve")
    monkeypatch.setenv("RADSERVE_RESULTS__SECONDARY_CAPTURE_KEY_IMAGES", "true")
    s = load_settings()
    assert s.results.secondary_capture_key_images is True
    assert s.server.port == 9001 and s.server.metrics_require_key is True
    assert s.scheduler.tat_s.inpatient == 120
    assert s.data_dir == Path("/srv/radserve")


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_config_file(tmp_path: Path, suffix: str) -> None:
    text = {
        ".yaml": (
            "server:\n  port: 8100\nscheduler:\n  max_batch_size: 4\n"
            "priority_rules:\n  - {attribute: BodyPartExamined, values: [HEAD], class: URGENT}\n"
        ),
        ".toml": (
            "[server]\nport = 8100\n[scheduler]\nmax_batch_size = 4\n"
            '[[priority_rules]]\nattribute = "BodyPartExamined"\nvalues = ["HEAD"]\n'
            'class = "URGENT"\n'
        ),
    }[suffix]
    s = load_settings(write(tmp_path / f"radserve{suffix}", text))
    assert s.server.port == 8100 and s.scheduler.max_batch_size == 4
    assert s.priority_rules[0].attribute == "BodyPartExamined"
    assert s.priority_rules[0].priority_class == PriorityClass.URGENT


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADSERVE_CONFIG", str(write(tmp_path / "c.yml", "server: {port: 8200}")))
    assert load_settings().server.port == 8200


def test_precedence_flags_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path / "c.yaml", "server: {host: 0.0.0.0, port: 1111}\ndata_dir: /file")
    monkeypatch.setenv("RADSERVE_SERVER__PORT", "2222")
    s = load_settings(config)
    assert (s.server.host, s.server.port, s.data_dir) == ("0.0.0.0", 2222, Path("/file"))
    s = load_settings(config, server__port=3333, data_dir=Path("/flag"), server__host=None)
    assert (s.server.host, s.server.port, s.data_dir) == ("0.0.0.0", 3333, Path("/flag"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sever: {port: 1}", "unknown setting 'sever'; did you mean 'server'?"),
        ("server: {prot: 1}", "unknown setting 'server.prot'; did you mean 'server.port'?"),
        (
            "scheduler: {tat_s: {urgnt: 0}}",
            "unknown setting 'scheduler.tat_s.urgnt'; did you mean 'scheduler.tat_s.urgent'?",
        ),
        ("server: {port: 70000}", "invalid setting 'server.port'"),
        ("ingest: {gantry_tilt: fix}", "invalid setting 'ingest.gantry_tilt'"),
        ("scheduler: {queue_limits: {urgent: 5}}", "URGENT work is never refused"),
        (
            "priority_rules: [{attribute: RequestedProcedurePriorty, values: [STAT], class: X}]",
            "invalid setting 'priority_rules.0.attribute': "
            "'RequestedProcedurePriorty' is not a DICOM keyword; "
            "did you mean 'RequestedProcedurePriority'?",
        ),
        (
            "priority_rules: [{attribute: AdmissionID, present: true, clas: URGENT}]",
            "unknown setting 'priority_rules.0.clas'; did you mean 'priority_rules.0.class'?",
        ),
        (
            "priority_rules: [{attribute: AdmissionID, class: URGENT}]",
            "needs exactly one of values / matches / present",
        ),
        (
            "priority_rules: [{attribute: AdmissionID, present: true, class: SOON}]",
            "unknown priority class 'SOON'",
        ),
    ],
)
def test_bad_keys_in_file_are_errors_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(write(tmp_path / "c.yaml", text))


def test_priority_rules_take_every_matcher_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "priority_rules:\n"
        "  - {attribute: CurrentPatientLocation, matches: '\\b(ED|ER)\\b', class: urgent}\n"
        "  - {attribute: AdmissionID, present: true, class: INPATIENT}\n"
    )
    rules = load_settings(write(tmp_path / "c.yaml", text)).priority_rules
    assert rules.classify({"CurrentPatientLocation": "ED bay 2"}) is PriorityClass.URGENT
    assert rules.classify({"AdmissionID": "A1"}) is PriorityClass.INPATIENT
    assert rules.classify({"RequestedProcedurePriority": "STAT"}) is PriorityClass.OUTPATIENT
    assert rules.keywords == ("CurrentPatientLocation", "AdmissionID")
    monkeypatch.setenv(
        "RADSERVE_PRIORITY_RULES",
        '[{"attribute": "BodyPartExamined", "values": ["HEAD"], "class": "URGENT"}]',
    )
    assert (
        load_settings().priority_rules.classify({"BodyPartExamined": "head"})
        is PriorityClass.URGENT
    )
    monkeypatch.setenv("RADSERVE_PRIORITY_RULES", '[{"attribute": "BodyPartExamind"}]')
    with pytest.raises(ConfigError, match="did you mean 'BodyPartExamined'"):
        load_settings()


def test_every_scheduler_knob_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The five knobs the scheduler had but settings could not set, and the job limits."""
    defaults = load_settings().scheduler
    assert (
        defaults.urgent_exclusive,
        defaults.max_running,
        defaults.lookahead_batches,
        defaults.max_prepared_batches,
        defaults.default_retry_after_s,
    ) == (True, 4, 2, 6, 30)
    monkeypatch.setenv("RADSERVE_SCHEDULER__URGENT_EXCLUSIVE", "false")
    monkeypatch.setenv("RADSERVE_SCHEDULER__MAX_RUNNING", "8")
    monkeypatch.setenv("RADSERVE_SCHEDULER__LOOKAHEAD_BATCHES", "3")
    monkeypatch.setenv("RADSERVE_SCHEDULER__MAX_PREPARED_BATCHES", "12")
    monkeypatch.setenv("RADSERVE_SCHEDULER__DEFAULT_RETRY_AFTER_S", "45")
    monkeypatch.setenv("RADSERVE_JOBS__RETRY_BACKOFF_S", "0")
    s = load_settings()
    assert (
        s.scheduler.urgent_exclusive,
        s.scheduler.max_running,
        s.scheduler.lookahead_batches,
        s.scheduler.max_prepared_batches,
        s.scheduler.default_retry_after_s,
        s.jobs.retry_backoff_s,
    ) == (False, 8, 3, 12, 45, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheduler: {max_running: 0}", "invalid setting 'scheduler.max_running'"),
        ("scheduler: {lookahead_batches: 0}", "invalid setting 'scheduler.lookahead_batches'"),
        ("scheduler: {max_prepared_batches: 0}", "'scheduler.max_prepared_batches'"),
        ("scheduler: {default_retry_after_s: 0}", "'scheduler.default_retry_after_s'"),
        ("scheduler: {urgent_exclusive: maybe}", "'scheduler.urgent_exclusive'"),
        ("scheduler: {max_runing: 2}", "did you mean 'scheduler.max_running'?"),
        ("jobs: {retry_backof_s: 2}", "did you mean 'jobs.retry_backoff_s'?"),
        ("jobs: {retry_backoff_s: -1}", "invalid setting 'jobs.retry_backoff_s'"),
        ("scheduler: {tat_s: {urgent: -5}}", "invalid setting 'scheduler.tat_s.urgent'"),
        # a risk webhook without its scheme failed every alert, quietly, at run time
        (
            "turnaround: {risk_webhook_url: alerts.hospital.local/risk}",
            "invalid setting 'turnaround.risk_webhook_url'",
        ),
        ("fhir: {url: 'ftp://fhir.local'}", "invalid setting 'fhir.url'"),
        # YAML's .inf passed every lower bound: a FHIR server that never answers held the
        # outbox's worker for ever; NaN fails every bound but was not always checked
        ("fhir: {timeout_s: .inf}", "'fhir.timeout_s': Input should be a finite number"),
        ("turnaround: {risk_margin_s: .inf}", "'turnaround.risk_margin_s'"),
        ("gateway: {quiet_s: .inf}", "'gateway.quiet_s': Input should be a finite number"),
        (
            "critical: {rules: [{label: x, min_volume_ml: .inf}]}",
            "'critical.rules.0.min_volume_ml'",
        ),
        ("turnaround: {half_life_jobs: .nan}", "'turnaround.half_life_jobs'"),
        # 10**18 threads failed every model's warm-up; running jobs exhausted memory in
        # the ETA walk (a slot list per walk); Ray refused its resources with a traceback
        ("runtime: {threads: 1000000000000000000}", "'runtime.threads'"),
        ("scheduler: {max_running: 1000000000000000000}", "'scheduler.max_running'"),
        ("ray: {num_cpus: 1000000000000000000}", "'ray.num_cpus'"),
        ("lifecycle: {variants: {threads: 5000}}", "'lifecycle.variants.threads'"),
        ("ingest: {min_spacing_mm: 30}", "min_spacing_mm (30) must be below"),
        # a host with an empty label raised UnicodeError in the sender's thread, past its
        # OSError handling: the audit export stopped without a word
        ("audit: {syslog: {host: 'collector..local'}}", "'audit.syslog.host'"),
        ("turnaround: {risk_syslog: {host: 'a..b'}}", "'turnaround.risk_syslog.host'"),
        (
            "critical: {receivers: [{name: s, kind: syslog, host: 'x..y'}]}",
            "'critical.receivers.0.host'",
        ),
    ],
)
def test_scheduler_knobs_are_validated_at_load(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(write(tmp_path / "c.yaml", text))


def test_unknown_environment_variables_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADSERVE_SERVR__PORT", "1")
    with pytest.raises(ConfigError, match="'servr' from environment variable RADSERVE_SERVR__PORT"):
        load_settings()
    monkeypatch.delenv("RADSERVE_SERVR__PORT")
    monkeypatch.setenv("RADSERVE_SERVER__PROT", "1")
    with pytest.raises(ConfigError, match=r"unknown setting 'server\.prot'"):
        load_settings()
    monkeypatch.delenv("RADSERVE_SERVER__PROT")
    monkeypatch.setenv("RADSERVE_TEST_ANYTHING", "x")  # test variables are not settings
    load_settings()


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'server\.hots'"):
        load_settings(server__hots="x")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.yaml", "[1, 2]", "must hold a mapping"),
        ("c.yaml", "server: [", "not valid YAML"),
        ("c.toml", "server = ", "not valid TOML"),
        ("c.json", "{}", "must end in .yaml, .yml or .toml"),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path / name, text))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.yaml")


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.server = s.server  # type: ignore[misc]
    with pytest.raises(ValidationError):
        s.server.port = 1  # type: ignore[misc]
    assert isinstance(s.priority_rules.root, tuple)
    with pytest.raises(ValidationError):
        s.priority_rules.root = ()  # type: ignore[misc]


def test_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg://radserve:s3cret@db.example:5432/radserve"
    monkeypatch.setenv("RADSERVE_DATABASE_URL", url)
    s = load_settings()
    assert s.effective_database_url == url
    assert "s3cret" not in repr(s) and "s3cret" not in s.to_yaml()
    assert yaml.safe_load(s.to_yaml())["database_url"] == (
        "postgresql+psycopg://radserve:***@db.example:5432/radserve"
    )
    assert mask_url("postgresql://u@h/db?password=x&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )


def test_invalid_secret_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADSERVE_DATABASE_URL", "mysql://u:hunter2@h/db")
    with pytest.raises(ConfigError, match="invalid setting 'database_url'") as info:
        load_settings()
    assert "hunter2" not in str(info.value)


def test_fingerprint_tracks_changes() -> None:
    assert load_settings().fingerprint() == load_settings().fingerprint()
    assert load_settings().fingerprint() != load_settings(server__port=1).fingerprint()


def test_ingest_settings_mirror_the_ingest_policy() -> None:
    from radserve.ingest.policy import IngestPolicy

    assert IngestPolicy.from_settings(Settings().ingest) == IngestPolicy()
    assert (
        IngestPolicy.from_settings(load_settings(ingest__gantry_tilt="flag").ingest).gantry_tilt
        == "flag"
    )


def test_config_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADSERVE_DATABASE_URL", "postgresql://u:hunter2@h/db")
    config = write(tmp_path / "c.yaml", "server: {port: 8300}")
    result = CliRunner().invoke(config_cli, ["show", "--config", str(config), "--data-dir", "/d"])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.output)
    assert shown["server"]["port"] == 8300 and shown["data_dir"] == "/d"
    assert shown["database_url"] == "postgresql://u:***@h/db"
    assert "hunter2" not in result.output
    assert shown["priority_rules"][0]["class"] == "URGENT"


def test_runtime_providers_choose_the_server_s_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radserve.errors import ModelError
    from radserve.service.catalog import Catalog

    assert load_settings().runtime.providers == ()
    monkeypatch.setenv("RADSERVE_RUNTIME__PROVIDERS", '["CPUExecutionProvider"]')
    monkeypatch.setenv("RADSERVE_RUNTIME__THREADS", "1")
    settings = load_settings()
    runtime = Catalog.from_settings(settings).sessions.runtime
    assert runtime.providers == ("CPUExecutionProvider",) and runtime.intra_op_threads == 1
    # a provider the installed onnxruntime lacks stops the server, naming what it has
    monkeypatch.setenv("RADSERVE_RUNTIME__PROVIDERS", '["CUDAExecutionProvider"]')
    with pytest.raises(ModelError, match=r"CUDAExecutionProvider.*were asked for"):
        Catalog.from_settings(load_settings())


def _reader_count_with_cores(cores: set[int]) -> int:
    """``server.read_processes`` "auto" resolved in a child process whose CPU affinity
    is ``cores`` (the real mask :func:`radserve.host.usable_cores` reads)."""
    import subprocess
    import sys

    code = (
        f"import os; os.sched_setaffinity(0, {sorted(cores)!r}); "
        "from radserve.config import load_settings; "
        "print(load_settings().server.reader_count())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADSERVE_SERVER__")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return int(done.stdout)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_read_processes_auto_is_two_readers_on_two_cores_and_none_on_one() -> None:
    assert load_settings().server.read_processes == "auto"
    assert _reader_count_with_cores({min(os.sched_getaffinity(0))}) == 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert _reader_count_with_cores(set(sorted(os.sched_getaffinity(0))[:2])) == 2


@pytest.mark.parametrize(("value", "count"), [("0", 0), ("3", 3), ("auto", None)])
def test_read_processes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, count: int | None
) -> None:
    monkeypatch.setenv("RADSERVE_SERVER__READ_PROCESSES", value)
    server = load_settings().server
    assert server.read_processes == (value if count is None else count)
    if count is not None:
        assert server.reader_count() == count


@pytest.mark.parametrize("value", ["many", "-1", "33"])
def test_read_processes_other_than_a_count_or_auto_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RADSERVE_SERVER__READ_PROCESSES", value)
    with pytest.raises(ConfigError, match="read_processes"):
        load_settings()


@pytest.mark.parametrize(
    ("peers", "extra", "message"),
    [
        (
            "[{ae_title: PACS, host: 10.0.0.5, storage_commitment: true}]",
            "",
            "peer PACS: storage_commitment is for a destination: give it a port",
        ),
        (
            "[{ae_title: PACS, host: 10.0.0.5, port: 104, commitment_timeout_s: 0}]",
            "",
            "commitment_timeout_s",
        ),
    ],
)
def test_storage_commitment_settings_that_cannot_work_are_refused_at_load(
    tmp_path: Path, peers: str, extra: str, message: str
) -> None:
    text = f"gateway:\n  allowed_peers: {peers}{extra}\n"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(write(tmp_path / "c.yaml", text))


def test_a_destination_with_storage_commitment_loads_with_its_timeout(tmp_path: Path) -> None:
    # several receiving processes too: they hand the reports to the outbox's process
    text = (
        "gateway:\n  receivers: 2\n  allowed_peers: [{ae_title: PACS, host: 10.0.0.5, "
        "port: 104, storage_commitment: true, commitment_timeout_s: 120}]\n"
    )
    settings = load_settings(write(tmp_path / "c.yaml", text))
    [destination] = destinations(settings.gateway)
    assert destination.storage_commitment and destination.commitment_timeout_s == 120
    assert settings.gateway.receivers == 2
