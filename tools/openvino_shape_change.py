"""What a new input shape costs an OpenVINO session, against padding the batch (issue 19).

OpenVINO's CPU plugin builds its kernels for every input shape it has not kept, and
radserve keeps none (``openvino_cpu_config``: memory). For each reference model at
each PRECISION, alternated in one process for ROUNDS rounds on the pipeline's batch
shapes: a batch of 2 slices, a batch of 1 after it (a new shape: a task's last,
partial batch before session 16), the batch of 2 again, and that one slice padded to
a batch of 2 (what ``ModelSession.run`` does since). Prints median process CPU-ms of
each (CPU-ms move least on a shared host) and whether the slice's output is the same
alone, padded and in the full batch, bit for bit.

    PYTHONPATH=src python tools/openvino_shape_change.py [ROUNDS] [PRECISION ...]
"""

import sys
import time

import numpy as np

from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool

# (model, version, one batch of the 300-slice bench study: 2 slices of its crop)
BATCHES = (("organs", "1.0.0", (2, 3, 160, 240)), ("lesions", "1.2.0", (2, 5, 176, 272)))


def _timed(session: object, batch: np.ndarray) -> tuple[float, np.ndarray]:
    """CPU-ms of one run of the bare ONNX Runtime session under ``session`` (its own
    ``run`` pads a partial batch since session 16), and the output."""
    raw, feed = session._session, session.input_name  # type: ignore[attr-defined]
    c0 = time.process_time()
    out = raw.run(None, {feed: batch})[0]
    return 1e3 * (time.process_time() - c0), out


def main(rounds: int, precisions: list[str]) -> None:
    registry = ModelRegistry()
    for precision in precisions:
        pool = SessionPool()
        for name, version, shape in BATCHES:
            session = pool.get(registry.get(name, version), precision)
            x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
            one, padded_in = x[:1], np.concatenate([x[:1], x[:1]])
            for _ in range(3):
                _timed(session, x)
            rows, same = [], True
            for _ in range(rounds):
                t_full, full = _timed(session, x)
                t_one, alone = _timed(session, one)
                t_again, _ = _timed(session, x)
                t_pad, padded = _timed(session, padded_in)
                rows.append((t_full, t_one, t_again, t_pad))
                same &= np.array_equal(alone[0], padded[0]) and np.array_equal(alone[0], full[0])
            m = np.median(np.array(rows), axis=0)
            print(
                f"{name} {precision}: batch of 2 {m[0]:.1f} CPU-ms, batch of 1 after it "
                f"{m[1]:.1f}, batch of 2 again {m[2]:.1f}, the slice padded to 2 {m[3]:.1f}; "
                f"outputs identical: {same}"
            )


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2:] or ["int8", "bf16", "fp32"])
