"""Does a serving process's memory grow with the jobs it runs? A real server in this
process (the test app behind uvicorn, SQLite in a scratch data folder, the test
bundles), the same small CT study (12 slices of 40x40, or ``--size``; new study, series, instance
UIDs and a new patient each time) uploaded ``--jobs`` times one after another through
``POST /v1/studies``, each job waited for; every ``--every`` jobs, after
``gc.collect()``, it prints the process's resident size (``VmRSS``), tracemalloc's
traced memory and the number of objects the collector tracks.

    cd <worktree> && PYTHONPATH=src:. python tools/memory_per_job.py --jobs 300

``--gateway`` sends each study over C-STORE to the server's gateway instead (one
association per study), ``--no-tracemalloc`` measures RSS without tracemalloc's own
cost, ``--diff 50 250`` prints what grew between those two checkpoints (tracemalloc
``compare_to`` by ``--key-type`` and the ``gc.get_objects()`` types that grew),
``--objects`` also prints the sizes of the service's in-memory maps (job cache, ...).
Timings are not measured: memory only.
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

MIB = 1 << 20


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def new_copy(files: list[Path], n: int) -> list[tuple[str, bytes]]:
    """The study of ``files`` with new UIDs and a new patient ``n``, as DICOM bytes."""
    import pydicom
    from pydicom.uid import generate_uid

    study, series = generate_uid(), generate_uid()
    out = []
    for p in files:
        ds = pydicom.dcmread(p)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = generate_uid()
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.PatientID = f"MEM{n:06d}"
        ds.PatientName = f"Mem^Patient{n}"
        ds.AccessionNumber = f"A{n:08d}"
        buffer = io.BytesIO()
        ds.save_as(buffer, enforce_file_format=True)
        out.append((p.name, buffer.getvalue()))
    return out


def type_counts() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def service_maps(service: Any) -> dict[str, int]:
    """Sizes of the service's long-lived in-memory maps that are keyed per job, study or
    request (the ones found by looking; a zero-cost read)."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        attrs = getattr(obj, "__dict__", None)
        if attrs is None:
            return
        for name, value in list(attrs.items()):
            if isinstance(value, (dict, list, set, tuple)) and len(value) > 0:
                sizes[f"{path}.{name}"] = len(value)
            elif hasattr(value, "__dict__") and type(value).__module__.startswith("radserve"):
                walk(value, f"{path}.{name}", depth + 1)

    walk(service, "service", 0)
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--gateway", action="store_true", help="C-STORE instead of REST")
    parser.add_argument("--no-tracemalloc", action="store_true")
    parser.add_argument("--frames", type=int, default=10, help="tracemalloc traceback depth")
    parser.add_argument(
        "--trace-from", type=int, default=0, help="start tracemalloc after this many jobs"
    )
    parser.add_argument("--diff", type=int, nargs=2, metavar=("FROM", "TO"))
    parser.add_argument("--key-type", default="traceback", choices=("traceback", "lineno"))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--objects", action="store_true")
    parser.add_argument(
        "--size",
        default="40x40x12",
        help="the study's ROWSxCOLSxSLICES (default 40x40x12; larger shows what a kept job costs)",
    )
    args = parser.parse_args(argv)
    rows, cols, slices = (int(v) for v in args.size.lower().split("x"))

    from tests.factories.service import auth, make_study, wait_job

    trace = not args.no_tracemalloc
    if trace and args.trace_from == 0:
        tracemalloc.start(args.frames)
    root = Path(tempfile.mkdtemp(prefix="radserve-mem-"))
    template = make_study(root / "template", rows=rows, cols=cols, n_slices=slices)
    snapshots: dict[int, Any] = {}
    types: dict[int, Counter[str]] = {}
    maps_at: dict[int, dict[str, int]] = {}
    print("jobs  rss_MiB  traced_MiB  gc_objects", flush=True)
    with _server(root, gateway=args.gateway) as (service, client, key, reader):

        def checkpoint(done: int) -> None:
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] / MIB if tracemalloc.is_tracing() else 0
            objects = len(gc.get_objects())
            print(f"{done:4d}  {rss_mib():7.1f}  {traced:10.2f}  {objects:10d}", flush=True)
            if args.diff and done in args.diff:
                if tracemalloc.is_tracing():
                    snapshots[done] = tracemalloc.take_snapshot().filter_traces(
                        [tracemalloc.Filter(False, tracemalloc.__file__)]
                    )
                types[done] = type_counts()
            if args.objects:
                maps_at[done] = service_maps(service)

        send = _gateway_sender(service) if args.gateway else None
        checkpoint(0)
        for n in range(1, args.jobs + 1):
            files = new_copy(template, n)
            if send is None:
                body = [("files", (name, data, "application/dicom")) for name, data in files]
                answer = client.post("/v1/studies", files=body, headers=auth(key))
                assert answer.status_code == 202, answer.text
                job_id = answer.json()["id"]
            else:
                job_id = send(files)
            job = wait_job(client, job_id, reader, timeout=120)
            assert job["state"] == "succeeded", job
            if n % args.every == 0:
                checkpoint(n)
            if trace and n == args.trace_from:
                tracemalloc.start(args.frames)
        if args.diff and all(d in types for d in args.diff):
            a, b = args.diff
            if a in snapshots and b in snapshots:
                print(f"\ntracemalloc {b} - {a} by {args.key_type}:")
                for stat in snapshots[b].compare_to(snapshots[a], args.key_type)[: args.top]:
                    print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
                    for line in stat.traceback.format(limit=args.frames)[-12:]:
                        print("     ", line)
            grown = types[b].copy()
            grown.subtract(types[a])
            print(f"\ngc object types grown {a} -> {b}:")
            for name, count in grown.most_common(args.top):
                print(f"  {count:+7d}  {name}  ({types[b][name]})")
        if maps_at:
            first, last = min(maps_at), max(maps_at)
            print(f"\nservice maps {first} -> {last} (those that changed):")
            for name in sorted(set(maps_at[first]) | set(maps_at[last])):
                before, after = maps_at[first].get(name, 0), maps_at[last].get(name, 0)
                if before != after:
                    print(f"  {name}: {before} -> {after}")
    return 0


@contextmanager
def _server(root: Path, *, gateway: bool) -> Iterator[tuple[Any, Any, str, str]]:
    """(service, httpx client, submit key, read key) of a real server on loopback; with ``gateway``
    its DICOM gateway too, delivering to a PACS on loopback that discards what it gets."""
    import httpx
    from tests.factories.dicom_net import FakePacs, free_port
    from tests.factories.service import ServerThread, create_key, settings_for

    from radserve.api import create_app
    from radserve.service import Service

    with ExitStack() as stack:
        overrides: dict[str, Any] = {}
        options: dict[str, Any] = {}
        if gateway:
            pacs = stack.enter_context(FakePacs(keep=False))
            overrides = {
                "gateway__enabled": True,
                "gateway__port": free_port(),
                "gateway__allowed_peers": [
                    {"ae_title": "PACS", "host": "127.0.0.1", "port": pacs.port}
                ],
            }
            options = {"gateway_options": {"quiet_s": 0.3}}
        service = Service(settings_for(root, **overrides), **options)
        srv = stack.enter_context(ServerThread(create_app(service)))
        client = stack.enter_context(httpx.Client(base_url=srv.url, timeout=60))
        assert service.wait_warm(60)
        yield (
            service,
            client,
            create_key(service.store, "submit"),
            create_key(service.store, "read"),
        )


def _gateway_sender(service: Any) -> Any:
    """A function sending a study over C-STORE (one association, calling AE ``PACS``)
    and returning the id of the job the gateway made of it."""
    from pynetdicom import AE
    from pynetdicom.sop_class import CTImageStorage

    port = service.gateway_address[1]
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    seen: set[str] = {j.id for j in service.store.list_jobs(limit=1000).items}

    def send(files: list[tuple[str, bytes]]) -> str:
        import pydicom

        assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
        assert assoc.is_established
        try:
            for _, data in files:
                status = assoc.send_c_store(pydicom.dcmread(io.BytesIO(data)))
                assert status.Status == 0, status
        finally:
            assoc.release()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            new = [j.id for j in service.store.list_jobs(limit=5).items if j.id not in seen]
            if new:
                seen.update(new)
                return new[0]
            time.sleep(0.05)
        raise TimeoutError("no job for the study sent")

    return send


if __name__ == "__main__":
    sys.exit(main())
