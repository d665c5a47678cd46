"""Installing a version does not deploy it, before or after a restart: a step the
pipeline leaves unpinned serves the latest version placed in a models folder (or a
model's first install) until a deployment names another, and a restart of the server
(crash, reboot, upgrade) resolves it the same way. Before, a restart served the latest
installed version to every study, untried, without anyone deploying it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from tests.factories.console import lesion_bundle
from tests.factories.service import settings_for

from radserve.config import Settings
from radserve.service import Service


@contextmanager
def _server(settings: Settings) -> Iterator[Service]:
    service = Service(settings)
    service.start(warm_up=False)  # as `radserve serve` starts: the deployments applied first
    try:
        yield service
    finally:
        service.stop()


def _serving(service: Service, pipeline: str | None = None) -> dict[str, str]:
    return service.catalog.resolve(pipeline).model_versions


def test_an_installed_version_serves_only_once_deployed_across_restarts(tmp_path: Path):
    settings = settings_for(tmp_path)
    models = Path(settings.models.dirs[0])
    pipelines = Path(settings.pipelines.dirs[0])
    site = yaml.safe_load((pipelines / "test-pipeline.yaml").read_text())
    site["name"] = "site-pipeline"
    site["steps"][1]["model"] = "lesions-site"  # a model this site only ever installed
    (pipelines / "site-pipeline.yaml").write_text(yaml.safe_dump(site))
    with _server(settings) as service:
        assert _serving(service)["lesions-test"] == "1.0.0"
        service.lifecycle.install(
            lesion_bundle(models, "1.1.0", tmp_path / "a", name="lesions-test")
        )
        service.lifecycle.install(
            lesion_bundle(models, "2.0.0", tmp_path / "b", name="lesions-site")
        )
        time.sleep(1.1)  # install times are kept to the second
        service.lifecycle.install(
            lesion_bundle(models, "1.5.0", tmp_path / "c", name="lesions-site")
        )
        assert _serving(service)["lesions-test"] == "1.0.0"
        assert _serving(service, "site-pipeline")["lesions-site"] == "2.0.0"
    with _server(settings) as service:  # a restart: nothing was deployed
        assert _serving(service)["lesions-test"] == "1.0.0"
        assert _serving(service, "site-pipeline")["lesions-site"] == "2.0.0"  # its first install
        listed = {(v["name"], v["version"]): v["deployed"] for v in service.lifecycle.status()}
        assert listed[("lesions-test", "1.0.0")] == ["stable"]
        assert listed[("lesions-test", "1.1.0")] == []
        service.lifecycle.deploy("lesions-test", "1.1.0", actor=None, reason="trial passed")
        assert _serving(service)["lesions-test"] == "1.1.0"
    with _server(settings) as service:  # deployed: it serves after a restart too
        assert _serving(service)["lesions-test"] == "1.1.0"
