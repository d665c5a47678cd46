"""CPU time of each model.yaml op alone on a 512 x 512 x 300 phantom study.

    PYTHONPATH=src python tools/measure_ops.py [--seed 0] [--repeat 3]

The image ops run on the CT's body box, the label-map ops on the phantom's true organ
map (every label), the finding ops inside find_lesions on its true lesion map with a
uniform confidence. CPU time (``time.process_time``, best of ``--repeat``) of the op
alone, with BLAS/OpenMP pools at one thread, so a noisy shared machine skews it little.
The figures in docs/model-ops.md come from one run of this script.
"""

from __future__ import annotations

import argparse
import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from radserve.domain import Prediction  # noqa: E402
from radserve.models.manifest import ModelSpec  # noqa: E402
from radserve.models.registry import ModelRegistry, bundled_model_dir  # noqa: E402
from radserve.phantom import PhantomSpec, generate_phantom  # noqa: E402
from radserve.postprocess.components import clean_label_map  # noqa: E402
from radserve.postprocess.findings import find_lesions  # noqa: E402
from radserve.preprocess.crop import body_bbox  # noqa: E402
from radserve.preprocess.denoise import read_filtered  # noqa: E402


def cpu(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def with_ops(spec: ModelSpec, pre: list[dict], post: list[dict]) -> ModelSpec:
    data = spec.model_dump(mode="json")
    return ModelSpec.model_validate({**data, "preprocess": pre, "postprocess": post})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    ps = PhantomSpec.random(args.seed).with_slices(300, None)
    phantom = generate_phantom(ps)
    ct, organs = phantom.ct, phantom.organs
    registry = ModelRegistry([bundled_model_dir()])
    organ_spec = registry.get("organs", "1.0.0").spec
    lesion_spec = registry.get("lesions", "1.2.0").spec
    print(f"CT {ct.shape}, spacing {tuple(round(s, 2) for s in ct.spacing)}")
    rows: list[tuple[str, float]] = []

    box = body_bbox(ct)
    for name, op in (
        ("median size 3", {"op": "median", "size": 3}),
        ("median size 5", {"op": "median", "size": 5}),
        ("gaussian sigma 1 mm", {"op": "gaussian", "sigma_mm": 1.0}),
    ):
        spec = with_ops(organ_spec, [op], [])
        rows.append(
            (f"preprocess {name} (body box)", cpu(
                lambda s=spec: read_filtered(ct.array, box, s.preprocess, ct.spacing[1:]),
                args.repeat,
            ))
        )  # fmt: skip

    base = [{"op": "threshold", "p": 0.5}]
    organ_labels = organs.array.astype(np.uint8)
    for name, ops in (
        ("min_size 0.5 ml + keep_largest (reference organs)",
         [op.model_dump() for op in organ_spec.postprocess[1:]]),
        ("opening 1 mm", [{"op": "opening", "radius_mm": 1.0}]),
        ("closing 1 mm", [{"op": "closing", "radius_mm": 1.0}]),
        ("closing 3 mm", [{"op": "closing", "radius_mm": 3.0}]),
        ("fill_holes 3-D", [{"op": "fill_holes"}]),
        ("fill_holes in-plane", [{"op": "fill_holes", "in_plane": True}]),
    ):  # fmt: skip
        spec = with_ops(organ_spec, [], base + ops)
        empty = with_ops(organ_spec, [], base)

        def run(s: ModelSpec = spec) -> None:
            clean_label_map(organ_labels, s, ct.voxel_volume_ml, spacing=ct.spacing)

        t_empty = cpu(lambda e=empty: clean_label_map(organ_labels, e, ct.voxel_volume_ml), 1)
        rows.append(
            (f"postprocess {name} (organ map, all labels)", cpu(run, args.repeat) - t_empty)
        )

    lesion_labels = (phantom.lesions.array > 0).astype(np.uint8)
    prediction = Prediction(
        "lesions", "1.2.0", "fp32", ct.with_array(lesion_labels),
        ct.with_array(np.full(ct.shape, 230, np.uint8)),
    )  # fmt: skip
    plain = with_ops(lesion_spec, [], base)
    for name, ops in (
        ("min_confidence 0.8", [{"op": "min_confidence", "value": 0.8}]),
        ("nms iou 0.3", [{"op": "nms", "iou": 0.3}]),
    ):
        spec = with_ops(lesion_spec, [], base + ops)
        t_plain = cpu(lambda: find_lesions(prediction, None, plain), args.repeat)
        t_op = cpu(lambda s=spec: find_lesions(prediction, None, s), args.repeat)
        rows.append((f"postprocess {name} ({len(phantom.lesion_list)} lesions)", t_op - t_plain))

    width = max(len(r[0]) for r in rows)
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.3f} s CPU")


if __name__ == "__main__":
    main()
