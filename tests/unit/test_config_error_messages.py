"""Settings errors as a user meets them, through the real ``radserve`` command.

Session 35: a model-level error (a duplicate critical receiver name: empty location, the
whole section as its input) echoed every receiver's token; a non-JSON list in an
environment variable (``RADSERVE_RUNTIME__PROVIDERS=CPUExecutionProvider``) ended every
command in a 58-line ``SettingsError`` traceback instead of the one-line
``config_invalid`` error other bad settings give."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.server_process import run_radserve

from radserve.passwords import hash_password

# one value per SecretStr setting (grep SecretStr src/radserve/config.py)
CRITICAL_TOKEN = "SECRETTOKEN123"
OTHER_TOKEN = "SECRETTOKEN456"
FHIR_TOKEN = "FHIRSECRET999"
DB_PASSWORD = "DBPASSWORD777"
AUDIT_KEY = "a1" * 32  # valid: 64 hex digits
PASSWORD_HASH = hash_password("correct horse battery staple", log2_n=14)
SECRETS = (CRITICAL_TOKEN, OTHER_TOKEN, FHIR_TOKEN, DB_PASSWORD, AUDIT_KEY, PASSWORD_HASH)


def radserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``radserve ARGS`` with none of this environment's ``RADSERVE_*`` settings, and ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return run_radserve(*args, env={**clean, "COLUMNS": "400", **(env or {})}, timeout=120)


def user(name: str) -> dict[str, Any]:
    return {"username": name, "role": "admin", "password_hash": PASSWORD_HASH}


def receiver(name: str, token: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "url": "https://ward.example/hook", "token": token, **more}


# each: the settings (every secret set alongside) and the location of the one error
CASES: dict[str, tuple[dict[str, Any], str]] = {
    # CriticalSettings' model validator: location "critical", the section as input
    "duplicate-receiver": (
        {
            "critical": {
                "receivers": [receiver("ward", CRITICAL_TOKEN), receiver("ward", OTHER_TOKEN)]
            }
        },
        "invalid setting 'critical'",
    ),
    # Settings' model validator: empty location, the whole file as input
    "fhir-receiver-without-url": (
        {"critical": {"receivers": [{"name": "ward", "kind": "fhir", "token": CRITICAL_TOKEN}]}},
        "invalid settings: ",
    ),
    # CriticalReceiverSettings' model validator: location "critical.receivers.0"
    "receiver-field-of-another-kind": (
        {"critical": {"receivers": [receiver("ward", CRITICAL_TOKEN, host="pacs")]}},
        "invalid setting 'critical.receivers.0'",
    ),
    # a list where a section belongs: the list (with its tokens) is the input
    "section-as-a-list": (
        {"critical": [{"receivers": [receiver("ward", CRITICAL_TOKEN)]}]},
        "invalid setting 'critical'",
    ),
    # a field validator of a list (unique console users): the list of users is the input
    "duplicate-console-user": (
        {"console": {"users": [user("bob"), user("BOB")]}},
        "invalid setting 'console.users'",
    ),
    # a mapping where a list belongs: the mapping (with its hash) is the input
    "console-users-as-a-mapping": (
        {"console": {"users": user("bob")}},
        "invalid setting 'console.users'",
    ),
}


def secret_settings(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` with every other SecretStr setting set too (they ride in echoed inputs)."""
    base: dict[str, Any] = {
        "database_url": f"postgresql+psycopg://radserve:{DB_PASSWORD}@db.example/radserve",
        "fhir": {"bearer_token": FHIR_TOKEN},
        "audit": {"key": AUDIT_KEY},
    }
    return {**base, **case}


@pytest.mark.parametrize("name", list(CASES))
def test_no_settings_error_echoes_a_secret(tmp_path: Path, name: str) -> None:
    settings, where = CASES[name]
    config = tmp_path / "crit.yaml"
    config.write_text(yaml.safe_dump(secret_settings(settings)))
    done = radserve("config", "show", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error [config_invalid]" in done.stderr and where in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    leaked = [secret for secret in SECRETS if secret in done.stdout + done.stderr]
    assert leaked == [], done.stderr


def test_a_check_across_sections_names_them_and_echoes_no_file(tmp_path: Path) -> None:
    """docs/critical-findings.md's receivers without ``fhir.url``: the error read
    ``invalid setting '': ... (got {...})``, an empty name and every setting of the file
    (and the environment) echoed after the message."""
    config = tmp_path / "crit.yaml"
    receivers = [{"name": "ehr", "kind": "fhir", "flag": True}]
    config.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path / "data"), "critical": {"receivers": receivers}})
    )
    done = radserve("config", "show", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid settings: " in done.stderr and "invalid setting ''" not in done.stderr
    assert "critical receiver 'ehr' (kind fhir) needs a url, or fhir.url" in done.stderr
    assert "(got " not in done.stderr and "data_dir" not in done.stderr, done.stderr


def test_no_error_echoes_a_secret_from_the_environment(tmp_path: Path) -> None:
    """The same duplicate from ``RADSERVE_*`` (JSON), as ``serve`` and ``run`` read it."""
    receivers = [receiver("ward", CRITICAL_TOKEN), receiver("ward", OTHER_TOKEN)]
    env = {
        "RADSERVE_CRITICAL__RECEIVERS": json.dumps(receivers),
        "RADSERVE_FHIR__BEARER_TOKEN": FHIR_TOKEN,
    }
    done = radserve("config", "show", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "receiver names must be unique" in done.stderr
    assert [s for s in SECRETS if s in done.stdout + done.stderr] == [], done.stderr


# variable, value, what the error says the JSON looks like
NOT_JSON = [
    ("RADSERVE_RUNTIME__PROVIDERS", "CPUExecutionProvider", """'["CPUExecutionProvider"]'"""),
    ("RADSERVE_SCHEDULER__TAT_S", "fast", "a JSON object with (some of) the fields urgent"),
    ("RADSERVE_GATEWAY__ALLOWED_PEERS", "x", "a JSON list of objects with the fields ae_title"),
]


@pytest.mark.parametrize(("variable", "value", "example"), NOT_JSON)
@pytest.mark.parametrize("command", ["config", "run", "outbox"])
def test_a_non_json_list_in_the_environment_is_a_one_line_error(
    tmp_path: Path, variable: str, value: str, example: str, command: str
) -> None:
    args = {
        "config": ["config", "show"],
        "run": ["run", str(tmp_path), "--out", str(tmp_path / "out")],
        "outbox": ["outbox", "list", "--data-dir", str(tmp_path / "data")],
    }[command]
    done = radserve(*args, env={variable: value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "SettingsError" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error [config_invalid]: ")
    assert f"environment variable {variable} must be JSON" in line
    assert example in line


@pytest.mark.parametrize(
    ("text", "env", "said"),
    [
        ("server:\n  port: true\n", {}, "'server.port': must be a number, not true"),
        ("gateway:\n  quiet_s: false\n", {}, "'gateway.quiet_s': must be a number, not false"),
        ("data_dir: ''\n", {}, "'data_dir': must name a path, not an empty one"),
        ("{}\n", {"RADSERVE_DATA_DIR": ""}, "'data_dir': must name a path, not an empty one"),
        ("audit:\n  key_file: ' '\n", {}, "'audit.key_file': must name a path"),
    ],
)
def test_a_value_pydantic_would_bend_is_refused(
    tmp_path: Path, text: str, env: dict[str, str], said: str
) -> None:
    """``port: true`` was port 1, and an empty data_dir the working folder, without a word."""
    config = tmp_path / "radserve.yaml"
    config.write_text(text)
    done = radserve("config", "show", "--config", str(config), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("ray", "said"),
    [
        ("address: not an address", "'ray.address': must be local, auto or a Ray head's HOST:PORT"),
        ("address: '10.0.0.5:99999'", "'ray.address': must be local, auto"),
        ("object_store_mb: 64", "'ray.object_store_mb': Input should be greater than or equal"),
    ],
)  # fmt: skip
def test_ray_settings_ray_would_refuse_once_serving_are_refused_here(
    tmp_path: Path, ray: str, said: str
) -> None:
    """Accepted by the settings, these ended `radserve serve` in Ray's traceback (exit 3)."""
    config = tmp_path / "radserve.yaml"
    config.write_text(f"executor: ray\nray:\n  {ray}\n")
    done = radserve("config", "show", "--config", str(config))
    assert done.returncode == 2 and said in done.stderr, done.stderr
    for fine in ("local", "auto", "ray-head.example:6379", "'[fd00::5]:6379'"):
        config.write_text(f"executor: ray\nray:\n  address: {fine}\n")
        assert radserve("config", "show", "--config", str(config)).returncode == 0, fine
