"""``radserve plan --device`` names a device the service times were measured on, by the
name the server gives it (GET /v1/ops/service-times). Before, ``--device`` renamed the
store's samples, so ``--device gpu`` planned with the CPU's times as "measured", and the
server's ``openvino`` was called ``cpu``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from click.testing import CliRunner, Result
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.cli import cli
from radserve.service import Service

RATE = ("--rate", "urgent=20/h", "--hours", "1")


def _plan(*args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", *RATE, *args])


def _refused(result: Result, *named: str) -> None:
    """A usage error on --device, in one line naming what was measured."""
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert "Invalid value for '--device'" in line
    assert all(n in line for n in named), line


def test_plan_names_the_device_as_the_server_does_and_refuses_any_other(
    tmp_path: Path,
) -> None:
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "admin")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
        answer = c.post("/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(key))
        assert answer.status_code == 202, answer.text
        assert wait_job(c, answer.json()["id"], key)["state"] == "succeeded"
        served = c.get("/v1/ops/service-times", headers=auth(key)).json()["device"]
    data = ("--data-dir", str(tmp_path / "data"))

    planned = _plan(*data, "--json")
    assert planned.exit_code == 0, planned.output
    times = json.loads(planned.stdout)["service_times"]
    assert times["device"] == served and times["measured"] is True
    named = _plan(*data, "--device", served, "--json")
    assert json.loads(named.stdout)["service_times"]["device"] == served
    others = {"gpu", "nonsense", "cuda:0", "cpu", "openvino"} - {served}
    for other in sorted(others):
        _refused(_plan(*data, "--device", other), f"no service times measured on '{other}'", served)


def test_a_file_measured_on_two_devices_plans_only_on_the_one_named(tmp_path: Path) -> None:
    model = tmp_path / "model.json"
    model.write_text(
        json.dumps(
            {
                "samples": [
                    {
                        "pipeline": "p",
                        "step": "run",
                        "device": device,
                        "precision": "fp32",
                        "slices": [10, 40],
                        "seconds": [seconds, seconds * 2],
                    }
                    for device, seconds in (("openvino", 2.0), ("cuda:0", 0.5))
                ]
            }
        )
    )
    file = ("--service-times", str(model))
    _refused(_plan(*file), "2 devices", "on openvino", "on cuda:0")
    _refused(_plan(*file, "--device", "gpu"), "on openvino", "on cuda:0")
    planned = _plan(*file, "--device", "cuda:0", "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["service_times"]["device"] == "cuda:0"


def test_with_nothing_measured_the_prior_takes_only_a_name_the_server_gives(
    tmp_path: Path,
) -> None:
    data = ("--data-dir", str(tmp_path / "data"))
    _refused(_plan(*data, "--device", "gpu"), "'gpu' is no device name", "cuda:N")
    planned = _plan(*data, "--device", "cuda:1", "--json")
    assert planned.exit_code == 0, planned.output
    times = json.loads(planned.stdout)["service_times"]
    assert times["device"] == "cuda:1" and times["measured"] is False
