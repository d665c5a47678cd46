"""Before/after of the C-STORE receive path in one run: ``radserve bench --scenario cstore``'s
runs from two source trees, alternated, so both see the same load.

    git archive <before-commit> src | tar -x -C /tmp/before
    python tools/cstore_ab.py --before /tmp/before --slices 150 --repeats 3

Each repeat runs every selected gateway mode at every concurrency once from each tree
(the order of the trees swapped on alternate repeats), each in a fresh interpreter with
that tree's ``src`` first on the path; no floors. Prints and writes (``--json``) medians
per (tree, mode, associations): instances/s and CPU-ms an instance (the SCP with its
receiving processes + the storescu senders), and after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, sys
import radserve.bench.cstore as cstore
modes, slices, assoc = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
cstore.MODES = tuple(m for m in cstore.MODES if m[0] in modes)
summary = cstore.run_cstore_bench(
    n_instances=slices, associations=tuple(assoc), repeats=1, floors=False, log=lambda _: None
)
print(json.dumps(summary["rows"]))
"""


def _run(tree: Path, modes: list[str], slices: int, assoc: list[int]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(modes), str(slices), json.dumps(assoc)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a source tree (has src/)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    # labels as radserve.bench.cstore.mode_label writes them (trees before 2026-12-02
    # session 11 named modes "per_instance", "2 receivers", ...: pass those for them)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["per_instance, 1 MiB PDU, 1 process", "per_instance, 1 MiB PDU, 2 receivers"],
    )
    parser.add_argument("--associations", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--slices", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    cells: dict[tuple[str, str, int], list[dict]] = {}
    load0 = os.getloadavg()[0]
    for repeat in range(args.repeats):
        order = list(trees) if repeat % 2 == 0 else list(trees)[::-1]
        for name in order:
            for row in _run(trees[name], args.modes, args.slices, args.associations):
                cells.setdefault((name, row["mode"], row["associations"]), []).append(row)
                print(
                    f"repeat {repeat + 1} {name}: {row['mode']}, {row['associations']}: "
                    f"{row['instances_per_s']:.0f}/s, {row['cpu_ms_per_instance']:.2f} "
                    f"+ {row['sender_cpu_ms_per_instance']:.2f} CPU-ms",
                    flush=True,
                )
    load1 = os.getloadavg()[0]
    rows = []
    for (name, mode, n), runs in sorted(cells.items(), key=lambda c: (c[0][1], c[0][2], c[0][0])):
        rows.append(
            {
                "tree": name,
                "mode": mode,
                "associations": n,
                "instances_per_s": statistics.median(r["instances_per_s"] for r in runs),
                "runs": [round(r["instances_per_s"]) for r in runs],
                "cpu_ms_per_instance": statistics.median(r["cpu_ms_per_instance"] for r in runs),
                "sender_cpu_ms_per_instance": statistics.median(
                    r["sender_cpu_ms_per_instance"] for r in runs
                ),
            }
        )
    print(f"\nload average {load0:.1f} -> {load1:.1f}; medians of {args.repeats} repeats")
    by = {(r["tree"], r["mode"], r["associations"]): r for r in rows}
    for mode in args.modes:
        for n in args.associations:
            b, a = by[("before", mode, n)], by[("after", mode, n)]
            rate = a["instances_per_s"] / b["instances_per_s"]
            print(
                f"{mode}, {n} association(s): {b['instances_per_s']:.0f} -> "
                f"{a['instances_per_s']:.0f}/s ({rate:.2f}x),"
                f" CPU-ms {b['cpu_ms_per_instance']:.2f} -> {a['cpu_ms_per_instance']:.2f} "
                f"({a['cpu_ms_per_instance'] / b['cpu_ms_per_instance']:.2f}x); runs "
                f"{b['runs']} -> {a['runs']}"
            )
    if args.json:
        args.json.write_text(json.dumps({"load_average": [load0, load1], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
