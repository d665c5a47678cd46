"""Side-by-side benchmark: radserve vs the naive baseline (and MONAI when installed).

Every contestant runs the same study with the same weights in its own process
(``radserve.bench.child``); this parent only prepares the study, compares the label
maps (Dice: the same answer, faster) and prints the ratios.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from radserve.bench.errors import BenchError
from radserve.bench.study import ensure_study
from radserve.evaluation.metrics import dice

logger = logging.getLogger(__name__)


@dataclass
class Contest:
    transfer_syntax: str
    # radserve contestant -> the precision it ran at
    precisions: dict[str, str] = field(default_factory=lambda: {"radserve": "fp32"})
    results: dict[str, dict[str, object]] = field(default_factory=dict)
    # (radserve contestant, baseline) -> Dice per structure group
    dice: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)


MONAI_INSTALL = "pip install torch==2.13.0 monai==1.6.1"


def monai_missing() -> list[str]:
    """What the MONAI baseline needs and is not installed (torch and monai only: the
    ONNX graph runs through :mod:`radserve.bench.torch_weights`, not onnx2torch)."""
    return [m for m in ("torch", "monai") if importlib.util.find_spec(m) is None]


def monai_available() -> bool:
    return not monai_missing()


def _monai_note(ran: dict[str, object] | None, failure: str | None) -> str:
    """What the bench ran as the MONAI baseline, or exactly why it did not."""
    if failure:
        return f"not run: the MONAI child failed: {failure}"
    if ran is None:
        missing = monai_missing()
        if missing:
            return f"not run: {', '.join(missing)} not installed ({MONAI_INSTALL})"
        return "not run: not asked for (--baseline)"
    versions = ran.get("versions") or {}
    return (
        f"ran: MONAI {versions.get('monai', '?')} (PydicomReader, SpatialResample, "
        f"SliceInferer) on torch {versions.get('torch', '?')} eager, FP32; the bundles' "
        "ONNX graphs run by radserve.bench.torch_weights (checked against ONNX Runtime)"
    )


def _run_child(mode: str, study: Path, workdir: Path, precision: str) -> dict[str, object]:
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "radserve.bench.child", mode, str(study), str(workdir), precision]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        logger.warning("the %s run's last output:\n%s", mode, "\n".join(lines[-25:]))
        raise BenchError(f"the {mode} run failed: {why}")
    return json.loads((workdir / "result.json").read_text())


def _agreement(a: Path, b: Path) -> dict[str, float]:
    """Dice of the organ labels (mean over organs present) and of the findings masks."""
    la, lb = np.load(a / "labels.npz"), np.load(b / "labels.npz")
    out: dict[str, float] = {}
    if "organs" in la and "organs" in lb:
        values = [v for v in np.union1d(np.unique(la["organs"]), np.unique(lb["organs"])) if v]
        scores = [dice(la["organs"] == v, lb["organs"] == v) for v in values]
        out["organs"] = float(np.nanmean(scores)) if scores else 1.0
    if "findings" in la and "findings" in lb:
        fa, fb = la["findings"] > 0, lb["findings"] > 0
        out["findings"] = 1.0 if not fa.any() and not fb.any() else float(dice(fa, fb))
    return out


def run_bench(
    *,
    syntaxes: tuple[str, ...] = ("explicit", "jpeg2000"),
    cache_dir: Path | None = None,
    n_slices: int = 300,
    precisions: tuple[str, ...] = ("fp32",),
    baselines: tuple[str, ...] = ("naive", "naive-ort", "monai"),
    log: Callable[[str], None] = print,
) -> dict[str, object]:
    """radserve at each of ``precisions`` (the first is the headline) against the
    baselines, which always run the fp32 weights: a faster answer must still be theirs."""
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    contests = []
    monai_failure: str | None = None
    ours = [radserve_mode(p, first=i == 0) for i, p in enumerate(precisions)]
    with tempfile.TemporaryDirectory(prefix="radserve-bench-") as tmp:
        for syntax in syntaxes:
            log(f"[{syntax}] preparing {n_slices}-slice 512x512 phantom study")
            study = ensure_study(cache_dir, syntax, n_slices)
            contest = Contest(syntax, precisions=dict(zip(ours, precisions, strict=True)))
            theirs = [b for b in baselines if b != "monai" or monai_available()]
            if "monai" in baselines and "monai" not in theirs:
                log(f"[{syntax}] MONAI baseline not run: {', '.join(monai_missing())} missing")
            for mode in ours + list(theirs):
                log(f"[{syntax}] running {mode}")
                precision = contest.precisions.get(mode, "fp32")
                child = "radserve" if mode in contest.precisions else mode
                try:
                    contest.results[mode] = _run_child(
                        child, study, Path(tmp) / syntax / mode, precision
                    )
                except BenchError as exc:
                    if mode != "monai":
                        raise
                    # the optional baseline: say why, keep the rest of the run
                    monai_failure = exc.message[:300]
                    log(f"[{syntax}] MONAI baseline failed: {monai_failure}")
                    theirs.remove("monai")
            for mine in ours:
                for mode in theirs:
                    contest.dice[(mine, mode)] = _agreement(
                        Path(tmp) / syntax / mine, Path(tmp) / syntax / mode
                    )
            contests.append(contest)
    summary = summarise(contests, n_slices)
    ran = next((c.results["monai"] for c in contests if "monai" in c.results), None)
    summary["monai"] = _monai_note(ran, monai_failure)
    return summary


def radserve_mode(precision: str, *, first: bool = True) -> str:
    """Contestant name: ``radserve`` for the headline precision, ``radserve-bf16``..."""
    return "radserve" if first else f"radserve-{precision}"


_MEMORY_KEYS = (
    "rss_after_warmup_mb",
    "pipeline_rss_mb",
    "workers_peak_rss_mb",
    "workers_peak_pss_mb",
    "tree_peak_rss_mb",
    "tree_peak_pss_mb",
)


def summarise(contests: list[Contest], n_slices: int) -> dict[str, object]:
    """The JSON summary: top-level keys describe the first (uncompressed) contest.

    Memory against the int16 volume, two ways, both always reported:
    ``peak_rss_over_int16_volume`` is the process's whole peak (imports and loaded
    models included: ~160 MiB that do not grow with the study);
    ``pipeline_rss_over_int16_volume`` counts only what the study added above the warm
    process. Helper processes (JPEG 2000 decoders) are in ``tree_peak_rss_mb`` (summed
    RSS, an upper bound) and ``tree_peak_pss_mb`` (their proportional share).
    """
    int16_mb = 512 * 512 * n_slices * 2 / 2**20
    per_syntax = {}
    for c in contests:
        by_precision = {p: _entry(c, mine, int16_mb) for mine, p in c.precisions.items()}
        entry = dict(next(iter(by_precision.values())))
        entry["precision"] = next(iter(c.precisions.values()))
        entry["by_precision"] = by_precision
        per_syntax[c.transfer_syntax] = entry
    first = per_syntax[contests[0].transfer_syntax]
    summary: dict[str, object] = {
        key: first.get(key)
        for key in (
            "radserve_s",
            "naive_s",
            "monai_s",
            "speedup_vs_naive",
            "speedup_vs_monai",
            "dice_vs_naive",
            "dice_vs_monai",
            "naive_engine",
            "naive_ort_s",
            "speedup_vs_naive_ort",
            "dice_vs_naive_ort",
            "peak_rss_mb",
            *_MEMORY_KEYS,
            "peak_rss_over_int16_volume",
            "pipeline_rss_over_int16_volume",
            "tree_pss_over_int16_volume",
            "stages",
        )
    }
    summary["study"] = {"shape": [n_slices, 512, 512], "int16_volume_mb": int16_mb}
    summary["monai"] = _monai_note(
        next((c.results["monai"] for c in contests if "monai" in c.results), None), None
    )
    summary["precision"] = first["precision"]
    summary["by_precision"] = first["by_precision"]
    summary["by_transfer_syntax"] = per_syntax
    return summary


def _entry(c: Contest, mine: str, int16_mb: float) -> dict[str, object]:
    """One radserve contestant against every baseline of its contest."""
    ours = c.results[mine]
    rs = float(ours["seconds"])  # type: ignore[arg-type]
    entry: dict[str, object] = {
        "radserve_s": rs,
        "radserve_cpu_s": ours.get("cpu_seconds"),
        "peak_rss_mb": ours["peak_rss_mb"],
        **{key: ours.get(key) for key in _MEMORY_KEYS},
        "stages": ours["stages"],
        "models": ours.get("models"),
        "providers": ours.get("providers"),
    }
    for mode in ("naive", "naive-ort", "monai"):
        name = mode.replace("-", "_")
        if mode in c.results:
            other = float(c.results[mode]["seconds"])  # type: ignore[arg-type]
            agreement = c.dice[(mine, mode)]
            entry[f"{name}_s"] = other
            entry[f"speedup_vs_{name}"] = other / rs
            entry[f"dice_vs_{name}"] = min(agreement.values()) if agreement else None
            entry[f"dice_vs_{name}_detail"] = agreement
            entry[f"{name}_peak_rss_mb"] = c.results[mode]["peak_rss_mb"]
            entry[f"{name}_stages"] = c.results[mode]["stages"]
            entry[f"{name}_engine"] = c.results[mode].get("engine")
        else:
            entry[f"{name}_s"] = entry[f"speedup_vs_{name}"] = entry[f"dice_vs_{name}"] = None
    entry["peak_rss_over_int16_volume"] = float(entry["peak_rss_mb"]) / int16_mb  # type: ignore[arg-type]
    own = entry.get("pipeline_rss_mb")
    entry["pipeline_rss_over_int16_volume"] = None if own is None else float(own) / int16_mb  # type: ignore[arg-type]
    tree = entry.get("tree_peak_pss_mb")
    entry["tree_pss_over_int16_volume"] = None if tree is None else float(tree) / int16_mb  # type: ignore[arg-type]
    return entry
