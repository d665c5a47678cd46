"""A MONAI bundle whose configs name a transform radserve does not map is refused from
its JSON/YAML alone, before torch and MONAI are imported (they cost ~6 CPU-s); what the
configs do not name plainly is left to the mapping after MONAI's parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.factories.monai_bundle import POST, PRE, inference_config, metadata

from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import _refuse_before_monai

_CHILD = """
import sys
from pathlib import Path
from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import import_monai
try:
    import_monai(Path(sys.argv[1]), Path(sys.argv[2]))
except ImportRefusedError as exc:
    print(exc)
print(sorted(m for m in ("torch", "monai") if m in sys.modules))
"""


def _bundle(folder: Path, **config: Any) -> Path:
    """The factory's bundle files; the weights are never read before such a refusal."""
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    (folder / "configs" / "inference.json").write_text(json.dumps(inference_config(**config)))
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata()))
    (folder / "models" / "model.pt").write_bytes(b"not read")
    return folder


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"post": [*POST[:3], {"_target_": "KeepLargestConnectedComponentd", "keys": "pred"}]},
            "postprocessing[3] KeepLargestConnectedComponentd is not expressible",
        ),
        (
            {
                "pre": [
                    *PRE[:5],
                    {"_target_": "monai.transforms.RandGaussianNoiseD", "keys": ["image"]},
                ]
            },
            "preprocessing[5] RandGaussianNoised is not expressible",
        ),
        ({"pre": [*PRE[:2], *PRE[3:]]}, "no Orientation(d) in preprocessing"),
    ],
)
def test_an_unmapped_transform_is_refused_without_torch(
    tmp_path: Path, config: dict, message: str
) -> None:
    bundle = _bundle(tmp_path / "bundle", **config)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(bundle), str(tmp_path / "models")],
        capture_output=True,
        text=True,
        check=True,
    )
    refusal, loaded = child.stdout.strip().splitlines()[-2:]
    assert message in refusal and loaded == "[]"
    assert not (tmp_path / "models").exists()


def test_what_the_configs_do_not_name_plainly_is_left_to_monai(tmp_path: Path) -> None:
    """Aliases (SpacingD, SpacingDict), another key's transform, a reference, a function
    target (the config guard names those) pass; the mapping after MONAI's parse decides."""
    pre = [
        *PRE[:3],
        {**PRE[3], "_target_": "SpacingD"},
        {**PRE[4], "_target_": "monai.transforms.ScaleIntensityRangeDict"},
        {"_target_": "RandGaussianNoised", "keys": "label"},
        {"_target_": "RandGaussianNoised", "keys": "@image_key"},
        {"_target_": "$@noise"},
        {"_target_": "monai.networks.utils.save_state", "src": {}, "path": "x"},
        PRE[5],
    ]
    bundle = _bundle(tmp_path / "bundle", pre=pre)
    _refuse_before_monai(bundle / "configs" / "inference.json", metadata())
    with pytest.raises(ImportRefusedError, match="input modality 'US'"):
        _refuse_before_monai(bundle / "configs" / "inference.json", metadata(modality="US"))
