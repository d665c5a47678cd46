"""One Ray worker's device, as ``ray.devices`` names it: parsed where the settings are
loaded (a bad entry is a configuration error naming it; before, the executor's start
ended in a traceback) and where the executor builds its actors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# the most threads one setting gives a pool or a worker: more is a typo (10**18 failed
# every model's warm-up; scheduler.max_running at 10**18 exhausted memory in the ETA walk)
MAX_THREADS = 1024

_SLOT = re.compile(
    r"^(?P<kind>cpu|gpu)(?::(?P<arg>\d+(?:\.\d+)?))?(?:@(?P<place>[A-Za-z0-9_.-]+))?$"
)
# how much of a placement resource a worker asks for: any node that has it will do
PLACE_SHARE = 0.001


@dataclass(frozen=True)
class DeviceSlot:
    """One worker's device. ``cpu:N``: a CPU slot with N threads (its Ray ``num_cpus``);
    ``gpu`` or ``gpu:F``: a GPU, or the fraction F of one (two workers on one GPU: 0.5).
    A suffix ``@RESOURCE`` places the worker on a node that offers that Ray custom
    resource (``ray start --resources '{"RESOURCE": 1}'``), e.g. ``gpu@node_b``."""

    name: str
    kind: str
    threads: int
    gpu_fraction: float = 0.0
    place: str | None = None

    @classmethod
    def parse(cls, text: str, index: int) -> DeviceSlot:
        match = _SLOT.match(text.strip())
        if match is None:
            raise ValueError(
                f"ray.devices entry {text!r}: expected cpu, cpu:<threads>, gpu or "
                "gpu:<fraction>, optionally followed by @<Ray resource> (a node to run on)"
            )
        kind, arg, place = match["kind"], match["arg"], match["place"]
        if kind == "cpu":
            threads = int(float(arg)) if arg else 1
            if not 1 <= threads <= MAX_THREADS:
                raise ValueError(
                    f"ray.devices entry {text!r}: a CPU slot needs 1 to {MAX_THREADS} threads"
                )
            return cls(f"ray-cpu{index}", "cpu", threads, place=place)
        fraction = float(arg) if arg else 1.0
        if not 0 < fraction <= 1:
            raise ValueError(f"ray.devices entry {text!r}: a GPU share must be in (0, 1]")
        return cls(f"ray-gpu{index}", "gpu", 2, fraction, place=place)

    def actor_options(self, max_restarts: int) -> dict[str, Any]:
        """Ray resources for the actor: its CPU threads (CPU slot) or GPU share, and a
        sliver of its placement resource."""
        options: dict[str, Any] = {"max_restarts": max_restarts, "max_task_retries": 0}
        if self.kind == "cpu":
            options["num_cpus"] = self.threads
        else:
            options["num_cpus"] = 1
            options["num_gpus"] = self.gpu_fraction
        if self.place is not None:
            options["resources"] = {self.place: PLACE_SHARE}
        return options
