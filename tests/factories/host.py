"""The host the model-install tests pretend to be: ONNX Runtime 1.24.1 with its CPU
provider only, no bf16, 4 GiB free (what ``models install`` checks a bundle's
``requires:`` and probe against; the real host's facts would make the tests vary)."""

from __future__ import annotations

from radserve.lifecycle.requirements import HostFacts

CPU_HOST = HostFacts(
    ort_version="1.24.1",
    providers=("CPUExecutionProvider",),
    runs_bf16=False,
    free_memory_mb=4096,
)
