"""Where ``bf16`` may serve: the one rule that the registry (``ModelBundle.rejection``:
``radserve models list``'s "servable", deploy, every session it hands out), a bundle's
``requires.precision: [bf16]`` (:func:`radserve.lifecycle.requirements.unmet_requirements`:
install, import, deploy, ``radserve doctor``) and doctor's "servable" column all apply.

bf16 is no file of its own: it is the fp32 graph run in bfloat16 by OpenVINO's CPU plugin,
on a CPU with native bfloat16 arithmetic (AMX or AVX-512 BF16). So it serves only where the
host has both *and* the server serves with OpenVINO first (``runtime.providers``,
:attr:`radserve.service.catalog.Catalog.serving_providers`): a server set to
``[CPUExecutionProvider]`` on an OpenVINO host runs every session on the CPU provider, which
has no bf16. Before 2026-12-07 the registry judged bf16 by the host's CPU alone, so
``models list`` called a bf16 variant "servable" on such a server, while its deploy
(``unmet_requirements``) and its sessions refused it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OPENVINO", "ServingProviders", "bf16_refusal", "host_runs_bf16"]

OPENVINO = "OpenVINOExecutionProvider"  # the provider whose CPU plugin runs bf16


def host_runs_bf16(available_providers: Sequence[str], cpu_bf16: str | None) -> bool:
    """Whether a host offering ``available_providers`` on a CPU whose native bfloat16
    instruction set is ``cpu_bf16`` (:func:`radserve.host.cpu_bf16_support`) can run bf16
    at all, whatever its server is set to serve with."""
    return OPENVINO in available_providers and cpu_bf16 is not None


def bf16_refusal(providers: Sequence[str], *, host_runs_bf16: bool) -> str | None:
    """Why bf16 cannot serve on ``providers`` (the serving ones, in order; empty: the
    host's choice, which puts OpenVINO first wherever the host has it) on a host that
    ``host_runs_bf16`` (:func:`host_runs_bf16`) or not; ``None``: it can.

    The reason continues a sentence about bf16 ("bf16 ..." / "needs bf16, which ...")."""
    if not host_runs_bf16:
        return "needs OpenVINO on a CPU with AMX or AVX-512 BF16; this host has neither"
    if providers and providers[0] != OPENVINO:
        return (
            f"runs on OpenVINO's CPU plugin only; this server serves with "
            f"{', '.join(providers)} (runtime.providers): put {OPENVINO} first in "
            "runtime.providers to serve it"
        )
    return None


@dataclass(frozen=True)
class ServingProviders:
    """What a server serves with, as the registry needs it to judge a precision: its
    execution providers in order (``Catalog.serving_providers``) and whether its host runs
    bf16 at all (:func:`host_runs_bf16`). Known once, when the server's runtime is chosen:
    judging a bundle costs no probe of the host (``radserve models list`` asks for every
    precision of every version)."""

    providers: tuple[str, ...]
    host_runs_bf16: bool

    def bf16_refusal(self) -> str | None:
        """:func:`bf16_refusal` for this server."""
        return bf16_refusal(self.providers, host_runs_bf16=self.host_runs_bf16)
