"""Refusals of the command line that were tracebacks, wrong exit codes, empty messages or
worse (2026-12-08, an imaging-IT engineer's first days with it).

``audit export --out <data dir>/audit/audit.key`` replaced the audit key with the records
(the chain could never be verified again) and ``--out`` under a file was a traceback;
``evaluate --json`` under a file was a traceback after the whole evaluation and a seed of
1000 a ValueError traceback; ``gateway echo --tls-cert`` without ``--tls-key`` a pydantic
traceback; ``console hash-password --username 'a: b'`` said only pydantic's web link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from radserve.cli import cli


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("RADSERVE_"):
            monkeypatch.delenv(name)


def _invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin)


def _one_line_refusal(result: Result, exit_code: int = 2) -> None:
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    created = _invoke("keys", "create", "--role", "read", "--data-dir", str(folder))
    assert created.exit_code == 0, created.output
    return folder


def test_audit_export_never_writes_over_the_audit_key(data: Path) -> None:
    key = data / "audit" / "audit.key"
    before = key.read_bytes()
    done = _invoke("audit", "export", "--data-dir", str(data), "--out", str(key))
    _one_line_refusal(done)
    assert "is the audit key" in done.output
    assert key.read_bytes() == before
    assert _invoke("audit", "verify", "--data-dir", str(data)).exit_code == 0


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("checkpoints.jsonl", "the audit checkpoint file"),
        ("../radserve.db", "the SQLite store"),
        ("../radserve.db-wal", "a file of the SQLite store"),
    ],
)
def test_audit_export_never_writes_over_the_stores_files(data: Path, name: str, what: str) -> None:
    out = data / "audit" / name
    before = out.read_bytes() if out.exists() else None
    done = _invoke("audit", "export", "--data-dir", str(data), "--out", str(out))
    _one_line_refusal(done)
    assert f"is {what}: write the export elsewhere" in done.output
    assert (out.read_bytes() if out.exists() else None) == before
    assert _invoke("audit", "verify", "--data-dir", str(data)).exit_code == 0


def test_audit_export_under_a_file_is_one_line(data: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    done = _invoke("audit", "export", "--data-dir", str(data), "--out", str(blocker / "a.jsonl"))
    _one_line_refusal(done)
    assert f"{blocker} is a file, not a folder" in done.output
    assert blocker.read_text() == "not a folder"


def test_audit_export_still_writes_an_export(data: Path) -> None:
    out = data / "exports" / "new folder ü" / "audit.jsonl"  # the data folder may hold one
    done = _invoke("audit", "export", "--data-dir", str(data), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert len(out.read_text().splitlines()) == 1
    assert [p.name for p in out.parent.iterdir()] == ["audit.jsonl"]


@pytest.mark.parametrize("option", ["--json", "--markdown"])
def test_evaluate_checks_its_output_files_first(tmp_path: Path, option: str) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    done = _invoke("evaluate", "--small", "--seeds", "0", option, str(blocker / "x"))
    _one_line_refusal(done)
    assert f"{blocker} is a file, not a folder" in done.output


@pytest.mark.parametrize("seeds", ["1000", "998-1001"])
def test_evaluate_refuses_training_seeds_as_a_usage_error(seeds: str) -> None:
    done = _invoke("evaluate", "--small", "--seeds", seeds)
    _one_line_refusal(done)
    assert "training seeds" in done.output


@pytest.mark.parametrize(
    "tls", [["--tls-cert"], ["--tls-key"]], ids=["cert without key", "key without cert"]
)
def test_gateway_echo_with_half_a_tls_pair_is_a_usage_error(tmp_path: Path, tls: list[str]) -> None:
    pem = tmp_path / "client.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    args = ["gateway", "echo", "--host", "127.0.0.1", "--port", "9", "--ae", "PACS"]
    done = _invoke(*args, *tls, str(pem), "--timeout", "1")
    _one_line_refusal(done)
    assert "cert and key go together" in done.output


def test_hash_password_says_why_a_username_is_refused() -> None:
    args = ["console", "hash-password", "--stdin", "--username", "a: b"]
    done = _invoke(*args, stdin="correct horse battery\n")
    _one_line_refusal(done)
    assert "errors.pydantic.dev" not in done.output
    assert "Invalid value for --username: username: String should match" in done.output


def _finished_job(data: Path) -> str:
    """A succeeded job in the store of ``data`` (its result folder with a report)."""
    import datetime as dt

    from radserve.config import load_settings
    from radserve.store import JobState
    from radserve.store.audited import open_audited

    store, _ = open_audited(load_settings(data_dir=data), create=False)
    try:
        job = store.create_job(
            priority_class="OUTPATIENT",
            deadline=dt.timedelta(minutes=30),
            pipeline_name="ct",
            pipeline_version="1",
            precision="fp32",
            fingerprint="e" * 64,
            study_path=str(data / "studies" / "x"),
        )
        result = data / "results" / job.id
        result.mkdir(parents=True)
        (result / "report.json").write_text("{}")
        store.transition(job.id, JobState.QUEUED)
        store.transition(job.id, JobState.RUNNING)
        store.record_result(job.id, result_path=str(result))
        return job.id
    finally:
        store.close()


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_export_to_a_file_is_one_line(data: Path, tmp_path: Path, where: str) -> None:
    job_id = _finished_job(data)
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    out = blocker if where == "a-file" else blocker / "export"
    done = _invoke("export", job_id, "--data-dir", str(data), "--out", str(out))
    _one_line_refusal(done)
    assert blocker.read_text() == "not a folder"
