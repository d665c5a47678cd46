"""How a segmentation head's fit decides OpenVINO-vs-torch label agreement (issue 18).

Reads WORK from ``tools/nnunet_head_features.py`` (the full benchmark's random body on
8 patches, head inputs from torch and from OpenVINO). For each recipe a 1x1x1 head is
fitted by ridge regression on torch's features (as ``bench/nnunet_model.fit_head``
does at bench time) and applied to both backends' features; printed per recipe: argmax
agreement OpenVINO vs torch over the 8 patches (all, air-only voxels, the rest), on the
most air-heavy patch, the share of voxels whose top-2 torch margin is below 0.05, and
how well the head learned its target (torch argmax vs :func:`hu_band_target`).

    PYTHONPATH=src python tools/nnunet_head_fit.py WORK
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from radserve.bench.nnunet_model import hu_band_target

work = Path(sys.argv[1])
meta = json.loads((work / "task.json").read_text())
subset, air = meta["subset"], meta["air"]
C, P = 32, 128**3
props = {"mean": 40.0, "std": 180.0}  # the plans' CT normalisation (bench/nnunet_model.py)


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def load(kind: str, i: int) -> np.ndarray:
    return np.memmap(work / f"{kind}_{i}.f32", np.float32, "r", shape=(C, P))


inputs = {i: np.fromfile(work / f"in_{i}.f32", np.float32) for i in subset}
hu = {i: inputs[i] * props["std"] + props["mean"] for i in subset}
target = {i: hu_band_target(hu[i]) for i in subset}
floor = {i: inputs[i] == meta["floor"] for i in subset}
ranked = sorted(subset, key=lambda i: air[i])
mixed = max(subset, key=lambda i: np.bincount(target[i], minlength=4).min())
airy = ranked[-1]
log("patches (air share):", {i: round(air[i], 2) for i in subset}, "mixed", mixed, "airy", airy)


def sample(patches: list[int], per_class: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    feats, ys = [], []
    for i in patches:
        t = target[i]
        ft = load("ft", i)
        for c in range(4):
            idx = np.flatnonzero(t == c)
            if len(idx):
                pick = np.sort(rng.choice(idx, min(per_class, len(idx)), replace=False))
                feats.append(np.asarray(ft[:, pick], np.float64))
                ys.append(np.full(len(pick), c))
    return np.hstack(feats), np.concatenate(ys)


def ridge(
    f: np.ndarray, y: np.ndarray, lam: float, margin: float = 4.0, noise: float = 0.0
) -> np.ndarray:
    """Ridge to +-``margin`` one-hot targets; ``noise`` > 0 adds ``noise`` x the
    covariance of OpenVINO-minus-torch features as a penalty (a head that avoids the
    directions the two backends disagree on: a ceiling for any head, not a model one
    could build without OpenVINO's features)."""
    a = np.vstack([f, np.ones(f.shape[1])]).T
    t = np.full((len(y), 4), -margin)
    t[np.arange(len(y)), y] = margin
    pen = lam * np.eye(a.shape[1])
    if noise:
        pen[:C, :C] += noise * noise_covariance()
    return np.linalg.solve(a.T @ a + pen, a.T @ t)


def noise_covariance(per_patch: int = 20000) -> np.ndarray:
    rng = np.random.default_rng(1)
    d = []
    for i in subset:
        pick = np.sort(rng.choice(P, per_patch, replace=False))
        d.append(np.asarray(load("fo", i)[:, pick], np.float64) - load("ft", i)[:, pick])
    diff = np.hstack(d)
    return diff @ diff.T / diff.shape[1]


def evaluate(w: np.ndarray) -> dict:
    agree = n = agree_air = n_air = 0
    learned = near = 0
    worst = (1.0, None)
    for i in subset:
        lt = w[:-1].T.astype(np.float32) @ load("ft", i) + w[-1].astype(np.float32)[:, None]
        lo = w[:-1].T.astype(np.float32) @ load("fo", i) + w[-1].astype(np.float32)[:, None]
        at, ao = lt.argmax(0), lo.argmax(0)
        same = at == ao
        agree += int(same.sum())
        n += P
        agree_air += int(same[floor[i]].sum())
        n_air += int(floor[i].sum())
        learned += int((at == target[i]).sum())
        top2 = np.sort(lt, axis=0)[-2:]
        near += int(((top2[1] - top2[0]) < 0.05).sum())
        worst = min(worst, (float(same.mean()), i))
    return {
        "agree": agree / n,
        "agree_air": agree_air / max(1, n_air),
        "agree_body": (agree - agree_air) / max(1, n - n_air),
        "worst_patch": worst,
        "near_tie_0.05": near / n,
        "learned": learned / n,
    }


recipes: dict[str, tuple] = {
    "mixed patch, ridge 1e-3 (as fit_head)": ([mixed], 20000, 1e-3),
    "mixed patch, ridge 1e2": ([mixed], 20000, 1e2),
    "mixed patch, ridge 1e4": ([mixed], 20000, 1e4),
    "mixed + airiest, ridge 1e-3": ([mixed, airy], 20000, 1e-3),
    "mixed + airiest, ridge 1e2": ([mixed, airy], 20000, 1e2),
    "mixed + airiest, ridge 1e4": ([mixed, airy], 20000, 1e4),
    "mixed + airiest + least airy, ridge 1e2": ([mixed, airy, ranked[0]], 20000, 1e2),
    "ceiling: mixed + airiest, OpenVINO noise penalty 1e10": ([mixed, airy], 20000, 1e-3, 1e10),
    "ceiling: mixed + airiest, OpenVINO noise penalty 1e11": ([mixed, airy], 20000, 1e-3, 1e11),
}
if len(sys.argv) > 2:
    recipes = {k: v for k, v in recipes.items() if sys.argv[2] in k}
results = {}
if len(sys.argv) <= 2:
    import torch

    state = torch.load(work / "head_random.pt")
    w = np.vstack([state["weight"].numpy().reshape(4, C).T, state["bias"].numpy()[None]])
    results["random head"] = r = evaluate(w.astype(np.float64))
    log("random head", json.dumps(r))
for name, (patches, per_class, lam, *noise) in recipes.items():
    f, y = sample(patches, per_class)
    w = ridge(f, y, lam, noise=noise[0] if noise else 0.0)
    results[name] = r = evaluate(w)
    log(name, json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}))
(work / "head_fit.json").write_text(json.dumps(results, indent=1))
