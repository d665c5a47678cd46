"""``ray.devices`` entries: CPU slots, GPU shares, and ``@RESOURCE`` placement on a node."""

from __future__ import annotations

import pytest

from radserve.config import ConfigError, load_settings
from radserve.domain.device_slot import PLACE_SHARE, DeviceSlot


@pytest.mark.parametrize(
    ("entry", "options"),
    [
        ("cpu:2", {"num_cpus": 2}),
        ("gpu:0.5", {"num_cpus": 1, "num_gpus": 0.5}),
        ("cpu:1@node_b", {"num_cpus": 1, "resources": {"node_b": PLACE_SHARE}}),
        ("gpu@Rack-2.a", {"num_cpus": 1, "num_gpus": 1.0, "resources": {"Rack-2.a": PLACE_SHARE}}),
    ],
)
def test_a_device_entry_becomes_the_actor_s_ray_resources(
    entry: str, options: dict[str, object]
) -> None:
    got = DeviceSlot.parse(entry, 0).actor_options(max_restarts=3)
    assert got == {"max_restarts": 3, "max_task_retries": 0, **options}
    assert load_settings(None, executor="ray", ray__devices=[entry]).ray.devices == (entry,)


@pytest.mark.parametrize("entry", ["cpu@", "cpu:1@a b", "tpu", "gpu:1.5@x", "cpu:0", "cpu:100000"])
def test_a_bad_device_entry_is_refused_at_load(entry: str) -> None:
    """A GPU share over 1 or a CPU slot of no (or 100,000) threads passed the settings'
    pattern, and the Ray executor's start ended in a traceback."""
    with pytest.raises(ValueError, match=r"ray\.devices entry"):
        DeviceSlot.parse(entry, 0)
    with pytest.raises(ConfigError, match=r"ray\.devices"):
        load_settings(None, executor="ray", ray__devices=["cpu:1", entry])


def test_a_cpu_slot_on_a_gpu_node_runs_on_the_cpu_by_the_default_preference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no ``runtime.providers`` set, a CPU worker on a node whose onnxruntime offers
    CUDA took TensorRT > CUDA first (the host's default order): it ran on the GPU that Ray
    had not given it. This machine has no GPU, so the node is described, not probed."""
    from radserve.inference import DeviceInfo, providers
    from radserve.scheduling.ray_worker import DeviceWorker

    gpu_node = DeviceInfo(
        "1.31",
        ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
        usable_cores=16,
        logical_cores=16,
        ort_device="GPU",
    )
    monkeypatch.setattr(providers, "probe_host", lambda: gpu_node)
    cpu = DeviceWorker(DeviceSlot.parse("cpu:4", 0))
    assert cpu.runtime.providers == ("CPUExecutionProvider",) and cpu.runtime.device == "cpu"
    assert cpu.runtime.intra_op_threads == 4
    gpu = DeviceWorker(DeviceSlot.parse("gpu:0.5", 1))
    assert gpu.runtime.device == "cuda:0" and gpu.runtime.primary == "TensorrtExecutionProvider"
