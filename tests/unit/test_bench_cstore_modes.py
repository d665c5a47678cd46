"""``radserve bench --scenario cstore``: each mode's label says what the gateway it runs is
configured with (durability, advertised PDU, receiving processes), and no two modes run
the same configuration under different names (as "per_instance" and "per_instance,
1 MiB PDU" did once 1 MiB became the default)."""

from __future__ import annotations

from pathlib import Path

from radserve.bench.cstore import DEFAULT_MODE, MODES
from radserve.gateway import ScpConfig


def _configured(settings: dict[str, object], tmp_path: Path) -> tuple[str, str, int, int]:
    """What the bench's SCP runs with (built as its runs build it)."""
    config = ScpConfig(data_dir=tmp_path, port=0, quiet_s=3600, **settings)
    sync = config.group_sync if config.durability == "group" else ""
    pdu = min(config.advertised_pdu_bytes, config.max_pdu_bytes)
    return config.durability, sync, pdu, config.receivers


def test_each_label_states_the_configuration_its_mode_runs(tmp_path: Path) -> None:
    for label, settings in MODES:
        durability, sync, pdu, receivers = _configured(settings, tmp_path)
        parts = label.split(", ")
        assert parts[0] == (durability if not sync else f"{durability} ({sync})"), label
        assert parts[1] == (
            f"{pdu // 1024**2} MiB PDU" if pdu >= 1024**2 else f"{pdu // 1024} KiB PDU"
        )
        assert parts[2] == ("1 process" if receivers == 1 else f"{receivers} receivers"), label


def test_no_two_modes_run_the_same_configuration(tmp_path: Path) -> None:
    configured = [_configured(settings, tmp_path) for _, settings in MODES]
    assert len(set(configured)) == len(MODES)
    assert len({label for label, _ in MODES}) == len(MODES)


def test_ratios_are_against_the_gateway_defaults() -> None:
    assert dict(MODES)[DEFAULT_MODE] == {}
