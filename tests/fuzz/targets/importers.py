"""Target (e): what ``radserve models import`` reads from an AI team's folder, up to
where the import would start building and exporting the network:

- nnU-Net: ``dataset.json`` and ``plans.json`` of a trainer folder
  (:func:`~radserve.importers.nnunet.read_results_folder`) mapped to a ``model.yaml``
  (:func:`~radserve.importers.nnunet.manifest_from_nnunet`);
- a MONAI bundle: ``configs/metadata.json`` and ``configs/inference.json``
  (:func:`~radserve.importers.monai_bundle.read_bundle`) mapped by
  :func:`~radserve.importers.monai_bundle.manifest_from_monai`, MONAI building the
  transforms through radserve's config guard;
- one ``$`` expression of a bundle config through the guard and MONAI's evaluation, as
  the import resolves a config item (``_parsed``).

Every refusal is an ImportRefusedError (a ModelError) naming the file or item.

Input layout: byte 0 chooses; the two JSON files are separated by a NUL byte."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import monai.inferers
import monai.transforms  # noqa: F401 - and its first import runs past the -timeout

from radserve.bench.nnunet_model import FOLDER, tiny_dataset, tiny_plans
from radserve.importers.monai_bundle import (
    MonaiSource,
    _parsed,
    manifest_from_monai,
    read_bundle,
)
from radserve.importers.monai_config_guard import CheckedConfigParser
from radserve.importers.nnunet import CHECKPOINT, manifest_from_nnunet, read_results_folder
from tests.factories.monai_bundle import ZOO, inference_config, metadata
from tests.fuzz.invariant import refusals_only

COVERED = ("radserve.importers", "radserve.models.manifest", "monai.bundle")
_ROOT = Path(tempfile.mkdtemp(prefix="radserve-fuzz-import-"))
_NNUNET = _ROOT / FOLDER
_BUNDLE = _ROOT / "bundle"
(_NNUNET / "fold_0").mkdir(parents=True)
(_NNUNET / "fold_0" / CHECKPOINT).write_bytes(b"")  # found, never read before export
(_BUNDLE / "configs").mkdir(parents=True)
(_BUNDLE / "models").mkdir()
(_BUNDLE / "models" / "model.pt").write_bytes(b"")  # found, read only to export

_NNUNET_SEEDS = ((tiny_dataset(), tiny_plans()), (tiny_dataset(), tiny_plans(channels=2)))
_EXPRESSIONS = (
    "torch.device('cpu')",
    "[x * 2 for x in range(3)]",
    "@bundle_root + '/models'",
    "import glob",
    "lambda x: x[0:1]",
    "max(1, min(4, 3)) if torch.cuda.is_available() else 0",
)


def seeds() -> list[bytes]:
    out = [bytes([0]) + json.dumps(d).encode() + b"\0" + json.dumps(p).encode()
           for d, p in _NNUNET_SEEDS]  # fmt: skip
    bundles = [(json.dumps(metadata()), json.dumps(inference_config()))]
    for zoo in sorted(ZOO.glob("*/configs/inference.json")):
        bundles.append(((zoo.parent / "metadata.json").read_text(), zoo.read_text()))
    out += [bytes([1]) + m.encode() + b"\0" + c.encode() for m, c in bundles]
    out += [bytes([2]) + e.encode() for e in _EXPRESSIONS]
    return out


def one_input(data: bytes) -> None:
    if not data:
        return
    choice, rest = data[0] % 3, data[1:]
    first, _, second = rest.partition(b"\0")
    with refusals_only():
        if choice == 0:
            (_NNUNET / "dataset.json").write_bytes(first)
            (_NNUNET / "plans.json").write_bytes(second)
            manifest_from_nnunet(read_results_folder(_NNUNET), name="fuzz", version="1.0.0")
        elif choice == 1:
            (_BUNDLE / "configs" / "metadata.json").write_bytes(first)
            (_BUNDLE / "configs" / "inference.json").write_bytes(second)
            manifest_from_monai(read_bundle(_BUNDLE), name="fuzz", version="1.0.0")
        else:
            _expression(rest.decode("utf-8", "replace"))


def _expression(text: str) -> None:
    parser = CheckedConfigParser({"bundle_root": str(_BUNDLE), "item": "$" + text})
    config = _BUNDLE / "configs" / "inference.json"
    source = MonaiSource(_BUNDLE, config, {}, parser, _BUNDLE / "models" / "model.pt", [])
    _parsed(source, "item")
