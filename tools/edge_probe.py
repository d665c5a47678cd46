"""Hostile DICOM at every door of a real ``radserve serve``: variants nobody sent yet.

    PYTHONPATH=src:. python tools/edge_probe.py            # every variant, every door
    PYTHONPATH=src:. python tools/edge_probe.py --ci       # the short mode the test runs
    PYTHONPATH=src:. python tools/edge_probe.py --variant big_endian --door stow

Each variant is a small CT study (12 slices of 40 x 40, one 700 HU lesion, tests'
``make_study``) changed with pydicom or at the byte level: encodings (big endian,
implicit VR, odd lengths, deep undefined-length sequences), pixel attributes that
contradict the data, pixel formats (float, double, MONOCHROME1, colour, planar, 1- and
32-bit), rescale values, geometry (missing, zero, non-orthonormal, duplicate, mixed),
other series in the study (localizer, reformat), identifiers (duplicate SOP Instance
UIDs, bad or long UIDs), character sets, broken encapsulated pixel data for every
compressed transfer syntax radserve accepts, and broken files (truncated, trailing
garbage, a huge declared length) in ``tools/edge_variants.py``; what a real scanner or
PACS sends (tilted, sheared, unevenly spaced or reordered stacks, localizers and dose
screenshots in the series, Enhanced CT whose per-frame groups disagree, padding, bits
above Bits Stored, fragments, more character sets) in ``tools/edge_scanner_variants.py``.
See docs/hostile-input.md for the list.

Doors: ``cstore`` (dcmtk's storescu to the gateway, with a good study on the same
association), ``stow`` (STOW-RS), ``form`` (``POST /v1/studies``) — each followed by a
good study — and ``run`` (``radserve run`` on the variant's folder, its own process).

Per variant and door the probe checks: no HTTP 5xx, no traceback or non-JSON line in
the server's log, the patient's name never in a log line or on stderr; a job that fails
fails with a specific error code (never ``internal_error``) and a one-line message; a
variant that must work succeeds with the good study's findings; the good study sent
beside it succeeds with its own findings (nothing lost or mixed); the server still
answers ``/healthz``; its peak RSS (server and children, ``VmHWM`` reset before each
case) stays within ``--rss-bound-mb`` of a good study's, and its open files come back
within ``--fd-slack`` of the count before the case. Prints one line per case and a
JSON summary; exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pydicom
from pydicom.uid import JPEG2000Lossless
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.ports import free_port
from tests.factories.server_process import (
    create_key_cli,
    gateway_pending,
    peak_rss_mb,
    radserve_command,
    reset_peak_rss,
    start_server,
    stop_servers,
)
from tests.factories.service import config_file, make_study
from tests.factories.waits import wait_until
from tools.edge_hostile_variants import hostile_variants
from tools.edge_scanner_variants import scanner_variants
from tools.edge_variants import (
    AGREEMENT_VARIANTS,
    CI_VARIANTS,
    NAME,
    NAME_PARTS,
    Files,
    Variant,
    variants,
)

CALLING = "EDGEPROBE"
FINAL = {"succeeded", "failed", "cancelled"}


# --- the server ------------------------------------------------------------------------------
@dataclass
class Case:
    variant: str
    door: str
    problems: list[str] = field(default_factory=list)
    outcome: str = ""
    peak_mb: float = 0.0
    fds: int = 0
    # the door's answer to the variant, comparable between doors: "ok" (its job
    # succeeded) or radserve's error code (the job's, the form's, STOW-RS's (0009,1001),
    # `radserve run`'s); "" when the door gave none (storescu would not send it)
    code: str = ""


class Server:
    def __init__(self, root: Path) -> None:
        self.gateway_port = free_port()
        gateway = {
            "enabled": True,
            "port": self.gateway_port,
            "quiet_s": 0.5,
            "interrupted_quiet_s": 1.0,
            "allowed_peers": [{"ae_title": CALLING, "host": "127.0.0.1"}],
        }
        self.config = config_file(root, gateway=gateway)
        self.data, self.log = root / "data", root / "server.log"
        port = free_port()
        self.process = start_server(self.config, self.data, port, self.log)
        self.url = f"http://127.0.0.1:{port}"
        self.submit = create_key_cli(self.config, self.data, "submit")
        self.read = create_key_cli(self.config, self.data, "read")
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def close(self) -> None:
        self.client.close()
        stop_servers([self.process])

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def jobs(self) -> list[dict[str, Any]]:
        jobs, cursor = [], None
        while True:
            params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
            page = self.client.get("/v1/jobs", params=params, headers=self.headers(self.read))
            page.raise_for_status()
            body = page.json()
            jobs += body["items"]
            cursor = body.get("next_cursor")
            if not cursor:
                return jobs

    def job(self, job_id: str) -> dict[str, Any]:
        return self.client.get(f"/v1/jobs/{job_id}", headers=self.headers(self.read)).json()

    def report(self, job_id: str) -> dict[str, Any] | None:
        got = self.client.get(f"/v1/jobs/{job_id}/report", headers=self.headers(self.read))
        return got.json() if got.status_code == 200 else None

    def settled(self) -> bool:
        return not gateway_pending(self.data) and all(j["state"] in FINAL for j in self.jobs())

    def healthy(self) -> bool:
        try:
            return self.client.get("/healthz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def reset_peak(self) -> None:
        reset_peak_rss(self.process.pid)

    def peak_mb(self) -> float:
        return peak_rss_mb(self.process.pid)

    def open_files(self) -> int:
        """The server process's open files (its children come and go: a decoding pool
        started again after a decoder crashed is new processes, not a leak)."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


def _findings(report: dict[str, Any] | None) -> list[tuple[str, int]]:
    """What must match between a variant and the good study: each finding's label and its
    volume rounded to 10 % steps of the lesion (4 mm sphere, about 0.27 ml)."""
    if not report:
        return []
    out = []
    for f in report.get("findings", []):
        volume = f.get("volume_ml") or f.get("measurements", {}).get("volume_ml") or 0.0
        out.append((str(f.get("label") or f.get("name")), round(float(volume) / 0.03)))
    return sorted(out)


# --- doors -----------------------------------------------------------------------------------
def _study_uid(folder: Path) -> str | None:
    for path in sorted(folder.rglob("*.dcm")):
        with contextlib.suppress(Exception):
            return str(pydicom.dcmread(path, stop_before_pixels=True, force=True).StudyInstanceUID)
    return None


def _stow_body(files: Files) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        b"--" + boundary.encode() + b"\r\nContent-Type: application/dicom\r\n\r\n" + p.read_bytes()
        for p in files
    ]
    body = b"\r\n".join(parts) + b"\r\n--" + boundary.encode() + b"--\r\n"
    return body, f'multipart/related; type="application/dicom"; boundary={boundary}'


def _stow_reasons(got: httpx.Response, case: Case, label: str) -> None:
    """The Failure Reasons (and their comments) of a Store Instances Response."""
    failed = got.json().get("00081198", {}).get("Value", [])
    reasons = sorted({f"0x{item['00081197']['Value'][0]:04X}" for item in failed})
    # a part the other doors skip rather than refuse (0x0122: an SR or a PDF, which
    # C-STORE quarantines; not_dicom: a file ingest passes over, with its reason) is
    # refused by design: the door's answer is then the study's job, not that code
    codes = [
        code
        for item in failed
        if item["00081197"]["Value"][0] != 0x0122
        and (code := item.get("00091001", {}).get("Value", [""])[0]) != "not_dicom"
    ]
    if label == "variant" and any(codes):
        case.code = case.code or next(c for c in codes if c)
    if reasons:
        case.outcome += f"{label} {len(failed)} failed {','.join(reasons)}; "
    if "0x0110" in reasons:  # processing failure: radserve did not say what was wrong
        case.problems.append(f"{label}: STOW-RS failure 0x0110 (processing failure)")


def _submit_http(server: Server, door: str, files: Files, case: Case, label: str) -> list[str]:
    """Send ``files`` through ``door``; the ids of the jobs it started."""
    if door == "form":
        upload = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
        got = server.client.post("/v1/studies", files=upload, headers=server.headers(server.submit))
    else:
        body, media = _stow_body(files)
        headers = {**server.headers(server.submit), "Content-Type": media}
        got = server.client.post("/dicomweb/studies", content=body, headers=headers)
    case.outcome += f"{label} HTTP {got.status_code}; "
    if got.status_code >= 500 and got.status_code != 503:
        case.problems.append(f"{label}: HTTP {got.status_code} {got.text[:200]}")
    if got.status_code >= 400:
        try:
            error = got.json()
        except ValueError:
            case.problems.append(f"{label}: HTTP {got.status_code} without a JSON body")
            return []
        if door == "stow" and "error" not in error:
            _stow_reasons(got, case, label)
        elif door == "stow" or door == "form":
            code = error.get("error", {}).get("code")
            case.outcome += f"{label} refused [{code}] {error.get('error', {}).get('message')}; "
            if label == "variant":
                case.code = case.code or str(code)
            if code in (None, "internal_error"):
                case.problems.append(f"{label}: refused without a specific code: {error}")
        return []
    if door == "form":
        return [got.json()["id"]]
    _stow_reasons(got, case, label)
    links = got.headers.get_list("link") if hasattr(got.headers, "get_list") else []
    # one Link header may name several jobs (one per study of the request), comma-joined
    targets = [target for link in links for target in re.findall(r"<([^>]*)>", link)]
    return [target.rsplit("/", 1)[-1] for target in targets]


# storescu -R proposes uncompressed syntaxes only unless told; dcmtk 3.6.7 has no option
# for JPEG Lossless process 14 (4.57) or HTJ2K: those go through pynetdicom
_STORESCU_PROPOSES = {
    "1.2.840.10008.1.2.4.70": ["-xs"],
    "1.2.840.10008.1.2.4.50": ["-xy"],
    "1.2.840.10008.1.2.4.80": ["-xt"],
    "1.2.840.10008.1.2.4.81": ["-xu"],
    "1.2.840.10008.1.2.4.90": ["-xv"],
    "1.2.840.10008.1.2.4.91": ["-xw"],
    "1.2.840.10008.1.2.5": ["-xr"],
    **{uid: [] for uid in ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.2")},
}


def _syntax_of(files: list[str]) -> str | None:
    for path in files:
        with contextlib.suppress(Exception):
            return str(pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID)
    return None


def _pynetdicom_store(
    server: Server, files: list[str], syntax: str, case: Case, label: str
) -> None:
    """The files as stored (no re-encoding), one association, with pynetdicom."""
    from pynetdicom import AE, _config
    from pynetdicom.sop_class import CTImageStorage

    _config.STORE_SEND_CHUNKED_DATASET = True
    ae = AE(CALLING)
    ae.acse_timeout = ae.network_timeout = ae.dimse_timeout = 60
    ae.add_requested_context(CTImageStorage, syntax)
    assoc = ae.associate("127.0.0.1", server.gateway_port, ae_title="RADSERVE")
    statuses = []
    try:
        for path in files:
            if not assoc.is_established:
                break
            try:
                status = assoc.send_c_store(path)
            except Exception as exc:  # the sender cannot read the file
                statuses.append(type(exc).__name__)
                continue
            statuses.append(f"0x{int(status.Status):04X}" if "Status" in status else "none")
    finally:
        if assoc.is_established:
            assoc.release()
    case.outcome += f"{label} pynetdicom {','.join(sorted(set(statuses)))}; "
    if "none" in statuses:
        case.problems.append(f"{label}: a C-STORE without an answer")


def _storescu(server: Server, folder: Path, case: Case, label: str) -> None:
    """One association per folder: storescu stops at a file it cannot send (exit 192 for
    an invalid UID), which would keep the next study from being sent at all."""
    tool = dcmtk_tool("storescu")
    files = [str(p) for p in sorted(folder.rglob("*.dcm"))]
    syntax = _syntax_of(files)
    if syntax is not None and syntax not in _STORESCU_PROPOSES:
        _pynetdicom_store(server, files, syntax, case, label)
        return
    command = [tool, "-R", *_STORESCU_PROPOSES.get(syntax or "", [])]
    command += ["-aet", CALLING, "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += ["-td", "60", "127.0.0.1", str(server.gateway_port), *files]
    # storescu may print bytes of the file it cannot send (a cut JPEG-LS codestream)
    done = subprocess.run(
        command, capture_output=True, text=True, errors="replace", timeout=300, check=False
    )
    lines = [x.strip() for x in done.stderr.splitlines() if x.strip()]
    case.outcome += f"{label} storescu rc {done.returncode} {' | '.join(lines[-2:])[:200]}; "


def _good_job(server: Server, jobs: list[dict[str, Any]], uid: str) -> dict[str, Any] | None:
    for job in jobs:
        report = server.report(job["id"]) if job["state"] == "succeeded" else None
        if report and report.get("study", {}).get("study_instance_uid") == uid:
            return job
    return None


def _latest_generations(server: Server, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``jobs`` less those a later job of the same study superseded: the gateway hands a
    study over when it has been quiet for ``quiet_s`` and runs it again, whole, when more
    of it arrives (a slow sender); the earlier generations ran on part of it."""
    newest: dict[str, dict[str, Any]] = {}
    kept = []
    for job in sorted(jobs, key=lambda j: j["arrival"]):
        report = server.report(job["id"]) if job["state"] == "succeeded" else None
        uid = (report or {}).get("study", {}).get("study_instance_uid")
        if uid:
            newest[uid] = job
        else:
            kept.append(job)
    return kept + list(newest.values())


def _check_job(
    server: Server, job: dict[str, Any], variant: Variant, case: Case, good: Any
) -> None:
    state, error = job["state"], job.get("error") or {}
    case.outcome += f"job {state}"
    if state == "failed":
        case.code = case.code or str(error.get("code"))
        case.outcome += f" [{error.get('code')}] {error.get('message')}"
        if error.get("code") in (None, "internal_error") or "\n" in str(error.get("message")):
            case.problems.append(f"unclear failure: {error}")
        if variant.expect == "ok":
            case.problems.append(f"must succeed, failed: {error.get('message')}")
    elif state == "succeeded":
        case.code = case.code or "ok"
        report = server.report(job["id"])
        found = _findings(report)
        if variant.expect == "refuse":
            case.problems.append("must be refused, succeeded")
        if found != good:
            case.problems.append(f"succeeded with findings {found}, the good study's {good}")
        case.problems += _warning_problems(report, variant)
        case.problems += _text_problems(server, job["id"])
    case.outcome += "; "


def _warning_problems(report: dict[str, Any] | None, variant: Variant) -> list[str]:
    """A variant that must be flagged (``Variant.warning``) has that warning in the
    report of its success."""
    if not variant.warning:
        return []
    said = [str(w.get("message", "")) for w in (report or {}).get("warnings", [])]
    if any(variant.warning in message for message in said):
        return []
    return [f"succeeded without a warning saying {variant.warning!r}"]


# dciodvfy's words for text a DICOM object does not encode as it declares (an error), or
# for a character set it does not know (a warning: no reader can decode the text)
_TEXT_ERRORS = ("repertoire", "Specific Character Set", "escape sequence")


def _text_problems(server: Server, job_id: str) -> list[str]:
    """The DICOM results radserve wrote for the job (SEG, SR: STOW-RS and gateway jobs)
    encode their text (the patient's name copied from the source) in the character set
    they declare, as dciodvfy reads them."""
    found = []
    for folder in server.data.rglob(f"{job_id}*"):
        for path in sorted(folder.glob("*.dcm")) if folder.is_dir() else []:
            run = subprocess.run(
                ["dciodvfy", str(path)], capture_output=True, timeout=60, check=False
            )
            for line in (run.stdout + run.stderr).decode("utf-8", "replace").splitlines():
                words = [word for word in _TEXT_ERRORS if word in line]
                if words and ("Error" in line or "Specific Character Set" in line):
                    # dciodvfy quotes the value (the patient's name): only its tag is kept
                    tag = re.search(r"\(0x[0-9a-fA-F]{4},0x[0-9a-fA-F]{4}\)", line)
                    where = tag.group(0) if tag else "an attribute"
                    found.append(f"{path.name}: dciodvfy: {where}: invalid for its {words[0]}")
    return found


def probe_http_door(
    server: Server, root: Path, variant: Variant, door: str, good: Any, baseline: float, args: Any
) -> Case:
    case = Case(variant.name, door)
    bad_dir, good_dir = root / f"{door}-{variant.name}", root / f"{door}-{variant.name}-good"
    files = make_study(bad_dir, extra={"PatientName": NAME})
    variant.make(bad_dir, files)
    make_study(good_dir, extra={"PatientName": NAME})
    good_uid = _study_uid(good_dir)
    before = {j["id"] for j in server.jobs()}
    fds = server.open_files()
    mark = server.log.stat().st_size
    server.reset_peak()
    if door == "cstore":
        _storescu(server, bad_dir, case, "variant")
        _storescu(server, good_dir, case, "good")
        started = None
    else:
        started = _submit_http(server, door, sorted(bad_dir.rglob("*.dcm")), case, "variant")
        _submit_http(server, door, sorted(good_dir.rglob("*.dcm")), case, "good")
    if not wait_until(server.settled, 240):
        case.problems.append("not settled within 240 s (a hang)")
    new = [j for j in server.jobs() if j["id"] not in before]
    good_job = _good_job(server, new, good_uid)
    if good_job is None or _findings(server.report(good_job["id"])) != good:
        case.problems.append(
            f"the good study beside it lost or changed: {good_job and good_job['state']}"
        )
    for job in _latest_generations(server, new):
        if good_job and job["id"] == good_job["id"]:
            continue
        if started is not None and job["id"] not in started:
            continue
        _check_job(server, server.job(job["id"]), variant, case, good)
    if variant.expect == "ok" and len(new) < 2:
        case.problems.append("must succeed: no job started for it")
    _common_checks(server, case, variant, mark, baseline, fds, args)
    return case


def _leaks(text: str, variant: Variant) -> list[str]:
    secrets = [*NAME_PARTS, *(s.decode("utf-8", "replace") for s in variant.secrets)]
    return [s for s in secrets if s and s in text]


def _common_checks(
    server: Server, case: Case, variant: Variant, mark: int, baseline: float, fds: int, args: Any
) -> None:
    if server.process.poll() is not None or not server.healthy():
        case.problems.append("server dead or /healthz not answering")
        return
    with open(server.log, "rb") as fh:
        fh.seek(mark)
        raw = fh.read()
    text = raw.decode("utf-8", "replace")
    for line in text.splitlines():
        if "Traceback" in line:
            case.problems.append(f"traceback in the log: {line[:300]}")
            break
        try:
            json.loads(line)
        except ValueError:
            case.problems.append(f"not a JSON log line: {line[:200]}")
            break
    leaked = _leaks(text, variant) + [s.hex() for s in variant.secrets if s in raw]
    if leaked:
        case.problems.append(f"patient name in the log: {leaked}")
    case.peak_mb = server.peak_mb() - baseline
    if case.peak_mb > args.rss_bound_mb:
        case.problems.append(f"peak RSS +{case.peak_mb:.0f} MB > {args.rss_bound_mb} MB")
    case.fds = server.open_files() - fds
    if case.fds > args.fd_slack:
        case.problems.append(f"{case.fds} more open files after the case")


def probe_run_door(root: Path, server: Server, variant: Variant, good: Any, args: Any) -> Case:
    case = Case(variant.name, "run")
    folder = root / f"run-{variant.name}"
    variant.make(folder, make_study(folder, extra={"PatientName": NAME}))
    out = root / f"run-{variant.name}-out"
    command = radserve_command(
        "run", str(folder), "--out", str(out), "--config", str(server.config), "--no-dicom",
        "--no-key-images",
    )  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        case.problems.append("radserve run did not end within 300 s")
        return case
    text = (stdout + stderr).decode("utf-8", "replace")
    rc = process.returncode
    case.outcome = f"exit {rc}: {stderr.decode('utf-8', 'replace').strip().splitlines()[-1:]}"
    if "Traceback" in text:
        case.problems.append(f"traceback: {text[-400:]}")
    if rc not in (0, 2):
        case.problems.append(f"exit status {rc}")
    if rc == 0:
        case.code = "ok"
    elif "error [" in text:
        case.code = text.split("error [", 1)[1].split("]", 1)[0]
    if rc == 2 and "error [" not in text:
        case.problems.append(f"no 'error [code]' line: {text[-300:]}")
    if rc == 2 and variant.expect == "ok":
        case.problems.append("must succeed, refused")
    if rc == 0:
        report = json.loads((out / "report.json").read_text())
        if variant.expect == "refuse":
            case.problems.append("must be refused, succeeded")
        if _findings(report) != good:
            case.problems.append(f"findings {_findings(report)} != the good study's {good}")
        case.problems += _warning_problems(report, variant)
    leaked = _leaks(text, variant) + [s.hex() for s in variant.secrets if s in stdout + stderr]
    if leaked:
        case.problems.append(f"patient name on stdout/stderr: {leaked}")
    return case


def _check_agreement(cases: list[Case], by_name: dict[str, Variant]) -> None:
    """One rule per door: the doors that answered a variant answered it alike (the same
    error code, or all "ok")."""
    answers: dict[str, dict[str, str]] = {}
    for case in cases:
        if case.code and case.door not in by_name[case.variant].agree_except:
            answers.setdefault(case.variant, {})[case.door] = case.code
    for name, by_door in answers.items():
        if len(set(by_door.values())) > 1:
            problem = f"the doors disagree: {by_door}"
            print(f"FAIL {name:38} {problem}", flush=True)
            for case in cases:
                if case.variant == name:
                    case.problems.append(problem)


# --- main ------------------------------------------------------------------------------------
DOORS = ("cstore", "stow", "form", "run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci", action="store_true", help="the short mode: a few variants")
    parser.add_argument("--variant", action="append", help="only these variants (repeatable)")
    parser.add_argument("--door", action="append", choices=DOORS, help="only these doors")
    parser.add_argument("--rss-bound-mb", type=float, default=96.0)
    parser.add_argument("--fd-slack", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write the cases here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)

    every_variant = [*variants(), *scanner_variants(), *hostile_variants()]
    chosen = [v for v in every_variant if (not args.ci or v.name in CI_VARIANTS)]
    if args.variant:
        chosen = [v for v in every_variant if v.name in args.variant]
    doors = args.door or list(DOORS)
    root = Path(tempfile.mkdtemp(prefix="edge-probe-"))
    server = Server(root)
    cases: list[Case] = []
    try:
        warm, good, baseline = Case("good", "all"), None, 0.0
        # warm every door up, and the decoding processes (started by the first compressed
        # study: JPEG 2000 here): their first start is no growth a variant caused
        warm_ups = (("form", None), ("stow", None), ("cstore", None), ("form", "j2k"))
        for k, (door, compressed) in enumerate(warm_ups):
            folder = root / f"good{k}"
            options = {"transfer_syntax": JPEG2000Lossless} if compressed else {}
            make_study(folder, extra={"PatientName": NAME}, **options)
            server.reset_peak()
            before = {j["id"] for j in server.jobs()}
            if door == "cstore":
                _storescu(server, folder, warm, "good")
            else:
                _submit_http(server, door, sorted(folder.rglob("*.dcm")), warm, "good")
            wait_until(server.settled, 240)
            new = [j for j in server.jobs() if j["id"] not in before]
            assert [j["state"] for j in new] == ["succeeded"], (door, new, warm.outcome)
            found = _findings(server.report(new[0]["id"]))
            assert found and found == (good or found), f"the good study's findings: {found}"
            good, baseline = found, max(baseline, server.peak_mb())
        print(f"good study: findings {good}; server peak {baseline:.0f} MB", flush=True)
        # the doors alternate per variant, so every variant goes through each door in
        # full mode, and the CI mode still reaches every door
        for k, variant in enumerate(chosen):
            every = not args.ci or variant.name in AGREEMENT_VARIANTS
            these = doors if every else [doors[k % len(doors)]]
            for door in these:
                judged = variant  # a door that answers otherwise by design may do either
                if door in variant.agree_except:
                    judged = replace(variant, expect="either")
                if door == "run":
                    case = probe_run_door(root, server, judged, good, args)
                else:
                    case = probe_http_door(server, root, judged, door, good, baseline, args)
                cases.append(case)
                mark = "ok  " if not case.problems else "FAIL"
                print(f"{mark} {variant.name:38} {door:6} {case.outcome[:260]}", flush=True)
                for problem in case.problems:
                    print(f"       - {problem[:400]}", flush=True)
    finally:
        server.close()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    _check_agreement(cases, {v.name: v for v in chosen})
    failed = [c for c in cases if c.problems]
    summary = {
        "cases": len(cases),
        "failed": len(failed),
        "max_peak_mb": max((c.peak_mb for c in cases), default=0.0),
        "max_fds": max((c.fds for c in cases), default=0),
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ for c in cases], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
