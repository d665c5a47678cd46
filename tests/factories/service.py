"""A server's settings, studies and API keys for service and API tests: tiny threshold
bundles and a test pipeline on disk, SQLite in a temporary data folder."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from radserve.config import Settings, load_settings
from radserve.store import Store
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.waits import WAIT_SCALE, until, wait_until

GRID = {"n_slices": 12, "rows": 40, "cols": 40, "spacing": (2.0, 1.0, 1.0)}
ORIGIN = (-19.5, -19.5, 0.0)


def lesion_hu(
    centre: Sequence[float] = (3.0, -2.0, 11.0), background: float = -1000.0
) -> Callable[[np.ndarray], np.ndarray]:
    """A 100 HU 'liver' block with a 700 HU sphere (radius 4 mm) at ``centre`` (LPS mm),
    in air (or in soft tissue, ``background=-100``, so the body fills the field)."""

    def hu(points: np.ndarray) -> np.ndarray:
        block = (np.abs(points - np.array([0.0, 0.0, 11.0])) < [15.0, 15.0, 40.0]).all(-1)
        sphere = np.linalg.norm(points - np.asarray(centre), axis=-1) <= 4.0
        return np.where(sphere, 700.0, np.where(block, 100.0, background))

    return hu


def write_assets(root: Path) -> dict[str, Any]:
    """Test bundles and pipeline under ``root``; the settings overrides that use them."""
    write_test_bundles(root / "models")
    write_test_pipeline(root / "pipelines", min_slices=3)
    return {
        "models__dirs": [str(root / "models")],
        "pipelines__dirs": [str(root / "pipelines")],
        "pipelines__default": "test-pipeline",
    }


def settings_for(root: Path, **overrides: Any) -> Settings:
    """Settings for a server whose data (SQLite, studies, results) lives in ``root/data``."""
    values = {"data_dir": str(root / "data"), **write_assets(root / "assets"), **overrides}
    return load_settings(None, **values)


def config_file(root: Path, **sections: Any) -> Path:
    """A YAML config file for ``radserve serve --config`` with the test assets."""
    assets = write_assets(root / "assets")
    data: dict[str, Any] = {
        "models": {"dirs": assets["models__dirs"]},
        "pipelines": {"dirs": assets["pipelines__dirs"], "default": "test-pipeline"},
        # one serving process: the default ("auto") spawns 2 API readers and their audit
        # writer on CI's 2 cores, seconds more at each server start and stop; the tests
        # of the readers ask for them (server={"read_processes": 2}) and
        # RADSERVE_SERVER__READ_PROCESSES=2 runs every server test with them
        "server": {"read_processes": 0},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value) if isinstance(value, dict) else data.update(
            {key: value}
        )
    path = root / "radserve.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def make_study(
    folder: Path,
    *,
    centre: Sequence[float] = (3.0, -2.0, 11.0),
    background: float = -1000.0,
    extra: dict[str, object] | None = None,
    **grid: Any,
) -> list[Path]:
    """A small CT series with one lesion; each call makes a new study (new UIDs)."""
    return make_ct_series(
        folder,
        **{**GRID, **grid},
        origin=ORIGIN,
        hu=lesion_hu(centre, background),
        study_uid=new_uid(),
        extra=extra,
    )


def upload(paths: Sequence[Path], field: str = "files") -> list[tuple[str, tuple[str, bytes, str]]]:
    """httpx ``files=`` for a multipart upload of ``paths``."""
    return [(field, (p.name, p.read_bytes(), "application/dicom")) for p in paths]


def create_key(store: Store, role: str) -> str:
    _, token = store.create_api_key(name=f"test {role}", role=role)
    return token


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class ServerThread:
    """A real uvicorn server for ``app`` on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        import socket
        import threading

        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        from radserve.api.http_limits import forwarded_trust, uvicorn_protocols
        from radserve.config import ServerSettings

        service = getattr(app.state, "service", None)
        server = service.settings.server if service else ServerSettings()
        config = uvicorn.Config(
            app,
            **uvicorn_protocols(server),  # as radserve serve runs it
            **forwarded_trust(server),
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self._thread.start()

        def started() -> bool:
            assert self._thread.is_alive() or self.server.started, "the test server's thread ended"
            return self.server.started

        until(started, "the test server to start", 60, step=0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self._thread.join(60)
        self._socket.close()


@contextmanager
def live_server(
    settings: Settings,
    *,
    roles: Sequence[str] = ("submit", "read"),
    warm: bool = True,
    client_timeout: float = 60.0,
    console: bool = False,
    **app_options: Any,
) -> Iterator[dict[str, Any]]:
    """A :class:`~radserve.service.Service` for ``settings`` behind a real HTTP server,
    an httpx client for it and an API key per role in ``roles``.

    Yields ``{"service", "url", "port", "client", "keys": {role: key}, <role>: key ...}``.
    ``warm``: wait until the workers have loaded the models (as a deployment would before
    taking traffic); ``console``: add the web console as ``radserve serve`` does;
    ``app_options`` go to :func:`radserve.api.create_app`. The server,
    the client and (through the app) the service are shut down afterwards."""
    import httpx

    from radserve.api import create_app
    from radserve.service import Service

    service = Service(settings)
    app = create_app(service, **app_options)
    if console:
        from radserve.console import install as install_console

        install_console(app, service)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=client_timeout) as c:
        if warm:
            assert service.wait_warm(60 * WAIT_SCALE)
        keys = {role: create_key(service.store, role) for role in roles}
        yield {
            "service": service,
            "url": srv.url,
            "port": srv.port,
            "client": c,
            "keys": keys,
            **keys,
        }


FINAL_STATES = ("succeeded", "failed", "cancelled")


def wait_job(client: Any, job_id: str, token: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` until the job is final; its last JSON, final or not
    (after ``timeout`` x :data:`~tests.factories.waits.WAIT_SCALE` s): the caller asserts
    the state it expects, and a time-out then shows the job as it stood."""
    job: dict[str, Any] = {}

    def final() -> bool:
        job.clear()
        job.update(client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json())
        return job["state"] in FINAL_STATES

    wait_until(final, timeout)
    return job


def make_models_slow(models_root: Path, *, layers: int = 3, channels: int = 16) -> None:
    """Replace the organ test model by one with the same answers and a heavy branch whose
    result is multiplied by zero: jobs then take long enough to be caught mid-flight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder = models_root / "organs-test" / "1.0.0"
    level = 50.0 / 1000.0
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([[[[0.0]]], [[[20.0]]]], np.float32), "w_thr"),
        numpy_helper.from_array(np.array([0.0, -20.0 * level], np.float32), "b_thr"),
        numpy_helper.from_array(np.zeros((1,), np.float32), "zero"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w_thr", "b_thr"], ["thr"], kernel_shape=[1, 1])]
    previous, width = "x", 1
    for i in range(layers):
        w = (rng.standard_normal((channels, width, 3, 3)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(
            helper.make_node(
                "Conv", [previous, f"w{i}"], [f"h{i}"], kernel_shape=[3, 3], pads=[1] * 4
            )
        )
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        previous, width = f"r{i}", channels
    nodes += [
        helper.make_node("ReduceMean", [previous], ["m"], keepdims=1),
        helper.make_node("Mul", ["m", "zero"], ["nothing"]),
        helper.make_node("Add", ["thr", "nothing"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "radserve_slow_test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2, "H", "W"])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "model.onnx"))
