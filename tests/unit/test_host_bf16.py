"""Whether the CPU runs bfloat16 natively: read from /proc/cpuinfo's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.host import bf16_slower_reason, cpu_bf16_support


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile avx512_bf16", "amx_bf16"),
        ("fpu sse2 avx2 avx512f avx512_bf16", "avx512_bf16"),
        ("fpu sse2 avx2 avx512f avx512_vnni", None),
    ],
)
def test_cpu_bf16_support_from_flags(tmp_path: Path, flags: str, expected: str | None) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n")
    assert cpu_bf16_support(info) == expected


def test_cpu_bf16_support_is_none_without_cpuinfo(tmp_path: Path) -> None:
    assert cpu_bf16_support(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_bf16_support(tmp_path / "arm") is None


def test_bf16_is_worth_it_only_with_amx() -> None:
    assert bf16_slower_reason("amx_bf16") is None
    assert "no AMX" in (bf16_slower_reason("avx512_bf16") or "")
    assert "no native bfloat16" in (bf16_slower_reason(None) or "")
