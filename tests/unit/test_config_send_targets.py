"""Where radserve sends (critical receivers, the deadline-risk webhook, the FHIR server)
checked at load as the HTTP client will parse it, through the real ``radserve`` command.

Probe of 2026-12-06: ``http://[::1/hook``, ``http://h:0/``, ``https://h:70000/`` and
``http:///risk`` loaded and the server started; each send then raised (a traceback, the
row left ``sending``, health all fine). A token with CR/LF, an inverted back-off and two
receivers named ``Ward`` and ``ward`` loaded too. Pattern errors quoted a regex whose
``^`` the CLI's redaction turned into ``<redacted>``; ``config show`` printed a
receiver's ``user:password@`` and ``?apikey=`` whole."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import BaseModel
from tests.factories.server_process import run_radserve

from radserve.config import ConfigError, Settings, load_settings


def radserve(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return run_radserve(*args, env={**clean, "COLUMNS": "400"}, timeout=120)


def write(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "radserve.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **settings}))
    return path


BAD_URLS = [
    "http://[::1/hook",  # the probe's: httpx raised InvalidURL at every send
    "http://127.0.0.1:0/hook",
    "https://127.0.0.1:70000/hook",
    "http://127.0.0.1:99999/hook",
    "http://127.0.0.1:-1/hook",
    "http://127.0.0.1:port/hook",
    "http:///hook",
    "http://:8080/hook",
    "ftp://127.0.0.1/hook",
    "127.0.0.1:9101/hook",
    "http://exa mple.org/hook",
    "http://example.org/ho\tok",
    "http://example.org/hook\r\nX-Evil: 1",
    "http://pacs..local/hook",
]


def _where(kind: str, url: str) -> dict[str, Any]:
    if kind == "critical":
        return {"critical": {"receivers": [{"name": "w", "url": url}]}}
    if kind == "critical-fhir":
        return {"critical": {"receivers": [{"name": "e", "kind": "fhir", "url": url}]}}
    if kind == "risk":
        return {"turnaround": {"risk_webhook_url": url}}
    return {"fhir": {"url": url}}


@pytest.mark.parametrize("kind", ["critical", "critical-fhir", "risk", "fhir"])
@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_the_client_cannot_send_to_is_a_config_error(
    tmp_path: Path, kind: str, url: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, _where(kind, url)))
    message = str(raised.value)
    assert "http:// or https:// URL" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9102/hook",
        "https://ward.example/fhir/R4",
        "http://[::1]:8080/hook",
        "http://a/h",
        "HTTPS://Ward.Example:1/x?y=1",
        "http://admin:pw@127.0.0.1:65535/hook?apikey=x",
    ],
)
def test_a_url_the_client_takes_loads(tmp_path: Path, url: str) -> None:
    settings = load_settings(write(tmp_path, _where("critical", url)))
    assert settings.critical.receivers[0].url == url
    httpx.URL(url)  # and the client takes it as it is


def test_the_probe_config_fails_at_load_in_one_line(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        {
            "critical": {
                "receivers": [
                    {"name": "badv6", "url": "http://[::1/hook"},
                    {"name": "ok", "url": "http://127.0.0.1:9102/ok"},
                ]
            }
        },
    )
    shown = radserve("config", "show", "--config", str(config))
    assert shown.returncode == 2, shown.stdout
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in shown.stderr
    assert "critical.receivers.0.url" in lines[0]
    assert "http:// or https:// URL" in lines[0]


@pytest.mark.parametrize("token", ["abc\r\nX-Evil: 1", "abc\nX", "abc\rX", "a\x00b", "abc\u00e9"])
@pytest.mark.parametrize("where", ["critical", "critical-fhir", "fhir"])
def test_a_token_with_a_line_break_is_a_config_error(
    tmp_path: Path, token: str, where: str
) -> None:
    if where == "fhir":
        data: dict[str, Any] = {"fhir": {"url": "http://a/f", "bearer_token": token}}
    else:
        data = _where(where, "http://a/h")
        data["critical"]["receivers"][0]["token"] = token
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, data))
    assert "printable ASCII" in str(raised.value)
    assert "X-Evil" not in str(raised.value) and "abc" not in str(raised.value)


@pytest.mark.parametrize(
    "section",
    [
        {"critical": {"retry_first_s": 100, "retry_max_s": 1}},
        {"fhir": {"retry_first_s": 100, "retry_max_s": 1}},
        {"gateway": {"retry_first_s": 7200, "retry_max_s": 3600}},
        {"audit": {"syslog": {"host": "a", "retry_first_s": 61}}},
    ],
)
def test_a_first_retry_longer_than_the_cap_is_a_config_error(
    tmp_path: Path, section: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match="must not be more than retry_max_s"):
        load_settings(write(tmp_path, section))


def test_equal_first_retry_and_cap_load(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, {"critical": {"retry_first_s": 5, "retry_max_s": 5}}))
    assert settings.critical.retry_first_s == settings.critical.retry_max_s == 5


def test_receiver_names_differing_only_in_case_are_a_config_error(tmp_path: Path) -> None:
    receivers = [{"name": "Ward", "url": "http://a/h"}, {"name": "ward", "url": "http://b/h"}]
    with pytest.raises(ConfigError, match=r"unique \(ignoring case\)"):
        load_settings(write(tmp_path, {"critical": {"receivers": receivers}}))


def test_pattern_errors_say_the_expected_form_in_words(tmp_path: Path) -> None:
    config = write(
        tmp_path, {"critical": {"receivers": [{"name": "ward station", "url": "http://a/h"}]}}
    )
    shown = radserve("config", "show", "--config", str(config))
    assert shown.returncode == 2
    assert "<redacted>" not in shown.stderr and "match pattern" not in shown.stderr
    assert "letters, digits" in shown.stderr


def _patterns(model: type[BaseModel], seen: set[type]) -> set[str]:
    """Every ``pattern`` constraint in the settings tree."""
    from typing import get_args

    found: set[str] = set()
    if model in seen:
        return found
    seen.add(model)

    def walk(annotation: Any, metadata: list[Any]) -> None:
        for meta in metadata:
            pattern = getattr(meta, "pattern", None)
            if isinstance(pattern, str):
                found.add(pattern)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.update(_patterns(annotation, seen))
        for arg in get_args(annotation):
            walk(arg, list(getattr(arg, "__metadata__", ())))
        walk_meta = getattr(annotation, "__metadata__", ())
        for meta in walk_meta:
            for inner in getattr(meta, "metadata", ()):
                pattern = getattr(inner, "pattern", None)
                if isinstance(pattern, str):
                    found.add(pattern)

    for field in model.model_fields.values():
        walk(field.annotation, list(field.metadata))
    return found


def test_every_pattern_setting_is_described_in_words() -> None:
    from radserve.config import PATTERN_WORDS

    patterns = _patterns(Settings, set())
    assert patterns, "the walk finds the pattern-checked settings"
    assert patterns <= set(PATTERN_WORDS), patterns - set(PATTERN_WORDS)


def test_config_show_masks_url_passwords_and_query_values(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        {
            "fhir": {"url": "https://fhiruser:FHIRPASS@fhir.example/R4?token=FHIRQUERY"},
            "turnaround": {"risk_webhook_url": "http://user:pa55w0rd@127.0.0.1:9101/risk"},
            "critical": {
                "receivers": [
                    {"name": "ward", "url": "http://admin:hunter2@127.0.0.1:9102/hook?apikey=QS"},
                    {"name": "desk", "url": "http://127.0.0.1:9102/hook?apikey=QUERYSECRET&x=1"},
                ]
            },
        },
    )
    shown = radserve("config", "show", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    for secret in ("hunter2", "QUERYSECRET", "pa55w0rd", "FHIRPASS", "FHIRQUERY", "=QS"):
        assert secret not in shown.stdout, secret
    assert "http://admin:***@127.0.0.1:9102/hook?apikey=***" in shown.stdout
    assert "hook?apikey=***&x=***" in shown.stdout
    assert "http://user:***@127.0.0.1:9101/risk" in shown.stdout
    # the settings themselves keep the URL: the sender needs it whole
    settings = load_settings(config)
    assert settings.critical.receivers[0].url is not None
    assert "hunter2" in settings.critical.receivers[0].url


def test_a_config_error_does_not_echo_a_url_password(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        {"critical": {"receivers": [{"name": "w", "url": "http://u:hunter2@[::1/h?k=SECRET"}]}},
    )
    shown = radserve("config", "show", "--config", str(config))
    assert shown.returncode == 2
    assert "hunter2" not in shown.stderr and "SECRET" not in shown.stderr
