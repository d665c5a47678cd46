"""The planner's host model alone, job by job: a saved ``radserve bench --scenario eta
--json`` run's trace simulated with every job given its *own* work (its end record's
stage timings with the sharing divided out, :func:`radserve.turnaround.solo.solo_timings`,
as ``radserve plan`` learns them), against what the server did with it. With the work
no longer drawn, what is left of the planner check's error is the simulated host and
policy (docs/history/turnaround.md, session 15).

The unmeasured fillers are matched to their end records by class and arrival; a filler
cancelled before it ended (no timings) is given the work of the nearest run of its size.
Per class: TAT p50 / p95 simulated against measured, and the mean wait (arrival to
start) and run (start to finish) of each, and the wall seconds their stage units ran
(simulated against the measured stage timings: how much sharing the division took out
and the simulation put back); ``--jobs`` prints every job. ``--consistent ROUNDS``
rescales each job's solo work until its simulated stage walls are its measured ones
(a division consistent with the simulation's sharing; session 15).

    PYTHONPATH=src python tools/planner_oracle.py out/eta.json [...] [--fine] [--jobs]
        [--consistent 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from radserve.bench.eta_accuracy import read_summary
from radserve.bench.eta_planner import recorded_jobs
from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.inference.providers import CPU_MAX_BATCH
from radserve.turnaround.service_time import RUN
from radserve.turnaround.simulate import (
    Arrival,
    JobService,
    SimConfig,
    SimJob,
    simulate_jobs,
)
from radserve.turnaround.solo import (
    JobRun,
    coarse_service,
    rescaled,
    slowdowns,
    solo_timings,
)
from radserve.turnaround.units import fine_service


def _runs(summary: dict[str, Any]) -> dict[str, JobRun]:
    """The succeeded jobs' runs by job id (``runs_from_end_records``, keyed)."""
    by_rank = {c.rank: c for c in PriorityClass}
    classes: dict[str, PriorityClass] = {}
    out: dict[str, JobRun] = {}
    records = summary["eta_records"]
    for rec in records:
        if rec["kind"] == "walk":
            for entry in rec["entries"]:
                classes.setdefault(str(entry[0]), by_rank[int(entry[1])])
    for rec in sorted(records, key=lambda r: float(r["at"])):
        timings = rec.get("timings")
        cls = classes.get(str(rec.get("job")))
        if rec["kind"] != "end" or rec.get("state") != "succeeded" or not timings or not cls:
            continue
        at = float(rec["at"])
        out[str(rec["job"])] = JobRun(
            cls, at - timings["total"], at - timings[RUN], at, int(rec["slices"]), timings
        )
    return out


def compare(path: Path, *, fine: bool, jobs: bool, consistent: int = 0) -> None:
    summary = read_summary(path)
    runs = _runs(summary)
    ids = list(runs)
    cores, workers = summary["host"]["usable_cores"], summary["cpu_workers"]
    factors = slowdowns([runs[i] for i in ids], cores, max_threads=workers + 1 + cores)
    solo = {i: solo_timings(runs[i], f) for i, f in zip(ids, factors, strict=True)}
    measured = recorded_jobs(summary)
    zero = next(runs[j.job_id].arrival - j.arrival for j in measured if j.job_id in runs)
    events = [(j.arrival, j.cls, j.job_id, True) for j in measured]
    used = {j.job_id for j in measured}
    for filler in summary.get("fillers", []):
        at, cls = float(filler[0]), PriorityClass.parse(filler[1])
        near = [
            (abs(runs[i].arrival - zero - at), i)
            for i in ids
            if i not in used and runs[i].cls is cls
        ]
        gap, job = min(near, default=(np.inf, ""))
        if gap < 0.5:
            used.add(job)
            events.append((at, cls, job, False))
            continue  # else cancelled: the nearest run of its size stands in
        size = filler[2]
        job = min((abs(runs[i].arrival - zero - at), i) for i in ids if runs[i].slices == size)[1]
        events.append((at, cls, job, False))
    events.sort(key=lambda e: e[0])
    start = events[0][0]
    scheduler = SchedulerSettings().capped(CPU_MAX_BATCH)
    batch = scheduler.max_batch_size

    def no_draw(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        raise AssertionError("every arrival brings its work")

    def replay() -> list[SimJob]:
        trace = [
            Arrival(
                at - start,
                cls,
                fine_service(solo[i], runs[i].slices, batch)
                if fine
                else coarse_service(solo[i], runs[i].slices, batch),
                kept,
            )
            for at, cls, i, kept in events
        ]
        return simulate_jobs(trace, no_draw, SimConfig(1, workers, scheduler, host_cores=cores))

    simulated = replay()
    # the job each arrival really was (a cancelled filler's stand-in is another's work)
    own = [
        i if runs[i].cls is cls and abs(runs[i].arrival - zero - at) < 0.5 else ""
        for at, cls, i, _ in events
    ]
    for _ in range(consistent):
        for i, sim in zip(own, simulated, strict=True):
            if i:
                solo[i] = rescaled(solo[i], runs[i], sim)
        simulated = replay()
    print(
        f"{path} ({'server units' if fine else 'coarse jobs'}, each job's own work"
        + (f", {consistent} rounds consistent with the simulation)" if consistent else ")")
    )
    walls = [
        (runs[i].cpu_s, sim.cpu_wall, runs[i].device_s, sim.device_wall)
        for i, sim in zip(own, simulated, strict=True)
        if i
    ]
    cpu, sim_cpu, device, sim_device = (float(np.sum(w)) for w in zip(*walls, strict=True))
    print(
        f"  stage walls, all jobs: CPU {sim_cpu:.1f}/{cpu:.1f} s ({sim_cpu / cpu - 1:+.0%}), "
        f"batches {sim_device:.1f}/{device:.1f} s ({sim_device / device - 1:+.0%}) "
        "(simulated/measured)"
    )
    rows = []
    for (at, cls, i, kept), sim in zip(events, simulated, strict=True):
        run = runs[i]
        if sim.started is None or sim.finished is None:
            continue
        real = (run.started - run.arrival, run.finished - run.started)
        got = (sim.started - sim.arrival, sim.finished - sim.started)
        if kept:
            rows.append(
                (cls, real, got, (run.cpu_s + run.device_s, sim.cpu_wall + sim.device_wall))
            )
        if jobs:
            print(
                f"  {'*' if kept else ' '}{cls.value:<10} {run.slices:3d} slices at "
                f"{at - start:7.2f} s  wait {real[0]:6.2f} / {got[0]:6.2f}  run "
                f"{real[1]:6.2f} / {got[1]:6.2f} s (measured / simulated)"
            )
    for cls in PriorityClass:
        mine = [r for r in rows if r[0] is cls]
        if not mine:
            continue
        real_tat = [r[1][0] + r[1][1] for r in mine]
        sim_tat = [r[2][0] + r[2][1] for r in mine]
        cells = []
        for q in (50, 95):
            want, got = np.percentile(real_tat, q), np.percentile(sim_tat, q)
            cells.append(f"p{q} {got:6.2f}/{want:6.2f} ({got / want - 1:+4.0%})")
        means = [float(np.mean([r[k][j] for r in mine])) for j in (0, 1) for k in (2, 1)]
        walls = [float(np.sum([r[3][j] for r in mine])) for j in (1, 0)]
        print(
            f"  {cls.value:<10} {len(mine):2d} jobs  TAT {'  '.join(cells)}  wait "
            f"{means[0]:5.2f}/{means[1]:5.2f}  run {means[2]:5.2f}/{means[3]:5.2f} s  stage "
            f"walls {walls[0] / walls[1] - 1:+4.0%} (simulated/measured)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, nargs="+")
    parser.add_argument("--fine", action="store_true", help="each job as the server's units")
    parser.add_argument("--jobs", action="store_true", help="print every job")
    parser.add_argument(
        "--consistent",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="rescale each job's solo work ROUNDS times until its simulated stage walls "
        "are its measured ones",
    )
    args = parser.parse_args()
    for path in args.summary:
        compare(path, fine=args.fine, jobs=args.jobs, consistent=args.consistent)


if __name__ == "__main__":
    main()
