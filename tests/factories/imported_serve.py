"""An imported model served by a real ``radserve serve``: installed over ``POST /v1/models``,
a DICOM CT sent over STOW-RS to a one-step pipeline, the SEG read back with highdicom.

Shared by the MONAI Bundle and nnU-Net serve tests (tests/e2e/test_imported_model_serve.py,
one server for the module) and the multi-sequence MR one (a server of its own).
"""

from __future__ import annotations

import io
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydicom
import yaml

from radserve.models.manifest import ModelSpec, load_manifest
from tests.factories.dicomweb import dicom_parts, job_of, related, split_related
from tests.factories.ports import free_port_on
from tests.factories.server_process import (
    create_key_cli,
    radserve_command,
    start_server,
    stop_servers,
)
from tests.factories.service import auth, config_file, wait_job

SEG = "1.2.840.10008.5.1.4.1.1.66.4"


@dataclass(frozen=True)
class ServedSeg:
    """The served SEG as a label map (the model's label values, slices ascending in z),
    the job's report, and the SEG and SR the server stored (saved as files, for dciodvfy)."""

    labels: np.ndarray
    segment_names: list[str]
    report: dict[str, Any]
    results: list[Path]


def zip_bundle(folder: Path, root: str) -> bytes:
    """``folder``'s files under ``root/`` in a zip, as ``POST /v1/models`` takes a bundle."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            zf.write(path, f"{root}/{path.relative_to(folder).as_posix()}")
    return buffer.getvalue()


class ImportedModelServer:
    """One ``radserve serve`` that imported models are installed into, one after another
    over ``POST /v1/models``; each study runs through a pipeline of its one model (a file
    in the server's pipelines folder, which the server looks up by name per request).

    A module's serve cases share one: a server per case cost a start (imports, warm-up)
    and a stop each, and what a case checks is its model's SEG, not a fresh server."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        config = config_file(root, dicomweb={"quiet_s": 0.5})
        self.pipelines = root / "pipelines"
        self.pipelines.mkdir()
        settings = yaml.safe_load(config.read_text())
        settings["pipelines"]["dirs"].append(str(self.pipelines))
        config.write_text(yaml.safe_dump(settings))
        data = root / "data"
        self.admin = create_key_cli(config, data, role="admin")
        self.submit = create_key_cli(config, data, role="submit")
        self.log = root / "serve.log"
        port = free_port_on("127.0.0.1")
        self.url = f"http://127.0.0.1:{port}"
        self.process = start_server(config, data, port, self.log)

    def serve(
        self,
        bundle: Path,
        files: list[Path],
        out: Path,
        *,
        selection: str = "{modalities: [CT]}",
    ) -> ServedSeg:
        """Install ``bundle`` (``<models>/<name>/<version>``), run the study ``files``
        (the series the pipeline's ``selection`` picks, and the other series a
        multi-channel model reads) through a pipeline of that one model, and decode the
        SEG it stored on the selected series (the SEG and SR saved under ``out``)."""
        spec = load_manifest(bundle / "model.yaml")
        study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        (self.pipelines / f"{spec.name}.yaml").write_text(
            f"name: {spec.name}\nversion: 1.0.0\nseries_selection: {selection}\n"
            f"steps:\n  - model: {spec.name}\n"
        )
        with httpx.Client(base_url=self.url, timeout=120) as c:
            r = c.post(
                "/v1/models",
                content=zip_bundle(bundle, f"{spec.name}/{spec.version}"),
                headers=auth(self.admin),
            )
            assert r.status_code == 201, r.text
            assert (r.json()["name"], r.json()["version"]) == (spec.name, spec.version)

            body, media = related(dicom_parts(files))
            r = c.post(
                f"/dicomweb/studies/{study_uid}",
                content=body,
                headers={"Content-Type": media, **auth(self.submit)},
                params={"pipeline": spec.name},
            )
            assert r.status_code == 200, r.text
            job_id = job_of(r)
            job = wait_job(c, job_id, self.submit, timeout=600)
            assert job["state"] == "succeeded", (job, self.log.read_text()[-3000:])
            report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(self.submit)).json()
            parts = split_related(
                c.get(f"/dicomweb/studies/{study_uid}", headers=auth(self.submit))
            )
        return _read_seg(parts, report, spec, files, out)

    def close(self) -> None:
        stop_servers([self.process])


@contextmanager
def imported_model_server(root: Path) -> Iterator[ImportedModelServer]:
    """A running :class:`ImportedModelServer` under ``root``, stopped afterwards."""
    server = ImportedModelServer(root)
    try:
        yield server
    finally:
        server.close()


def serve_and_read_seg(
    tmp_path: Path, bundle: Path, files: list[Path], *, selection: str = "{modalities: [CT]}"
) -> ServedSeg:
    """:meth:`ImportedModelServer.serve` on a server of its own, for a module of one case."""
    with imported_model_server(tmp_path) as server:
        return server.serve(bundle, files, tmp_path / "served", selection=selection)


def _read_seg(
    parts: list[tuple[str, bytes]],
    report: dict[str, Any],
    spec: ModelSpec,
    files: list[Path],
    out: Path,
) -> ServedSeg:
    """The one SEG among the stored ``parts`` as a label map of ``spec``'s values on the
    job's selected series of ``files``; the SEG and SR saved under ``out``."""
    import highdicom as hd

    stored = [pydicom.dcmread(io.BytesIO(b)) for _, b in parts]
    results = []
    for ds in (d for d in stored if d.Modality in ("SEG", "SR")):
        results.append(out / f"{ds.Modality}-{len(results)}.dcm")
        results[-1].parent.mkdir(parents=True, exist_ok=True)
        ds.save_as(results[-1], enforce_file_format=True)
    segs = [d for d in stored if d.SOPClassUID == SEG]
    assert len(segs) == 1
    seg = hd.seg.Segmentation.from_dataset(segs[0])
    names = {s.SegmentNumber: str(s.SegmentLabel) for s in seg.SegmentSequence}
    # the source slices in ascending position, as radserve's volume holds them
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in files]
    selected = served_series(report)
    headers = [h for h in headers if h.SeriesInstanceUID == selected]
    headers.sort(key=lambda h: float(h.ImagePositionPatient[2]))
    # a slice with no segment has no frame in the SEG: background
    pixels = seg.get_pixels_by_source_instance(
        [str(h.SOPInstanceUID) for h in headers],
        combine_segments=True,
        assert_missing_frames_are_empty=True,
    )
    value = {label.name: label.value for label in spec.labels}
    served = np.zeros(pixels.shape, np.uint8)
    for number, name in names.items():
        served[pixels == number] = value[name]
    return ServedSeg(served, sorted(names.values()), report, results)


def served_series(report: dict[str, Any]) -> str:
    """The Series Instance UID the job ran on (its report's selected series)."""
    return str(report["series_selection"]["selected"]["series_instance_uid"])


def import_cli(*args: str) -> str:
    """``radserve models import ARGS``, which must succeed: what it printed."""
    done = subprocess.run(
        radserve_command("models", "import", *args),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_cli(
    tmp_path: Path,
    models: Path,
    name: str,
    study: Path,
    selection: str = "{modalities: [CT]}",
) -> tuple[np.ndarray, Path]:
    """``radserve run`` of a one-step pipeline of model ``name`` on ``study`` (series
    ``selection``): its labels and its output folder."""
    from radserve.ingest.nifti import load_nifti

    pipeline = tmp_path / "run-pipeline.yaml"
    pipeline.write_text(
        f"name: run-{name}\nversion: 1.0.0\nseries_selection: {selection}\n"
        f"steps:\n  - model: {name}\n"
    )
    out = tmp_path / "run-out"
    args = ["--pipeline", str(pipeline), "--out", str(out), "--models-dir", str(models)]
    command = radserve_command("run", str(study), *args, "--no-key-images")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    assert (out / f"{name}-seg.dcm").is_file()
    return load_nifti(out / f"{name}.nii.gz").array, out
