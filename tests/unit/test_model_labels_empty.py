"""A model.yaml without labels is refused where it is read (2026-12-08 trial).

``labels: []`` passed :func:`load_manifest`; install then failed on the class count
(``max() arg is an empty sequence``: a ValueError, HTTP 500 for ``POST /v1/models``),
and nnU-Net's dataset.json of the background alone mapped to such a model, refused only
by that crash after the network was built. Now the manifest itself refuses it, naming
the field, for a hand-written bundle, an install and both importers (they validate the
manifest they map).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.nnunet_folder import FOLDER, tiny_dataset, tiny_plans

from radserve.errors import BundleRejectedError, ModelError
from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import manifest_from_nnunet, read_results_folder
from radserve.lifecycle.install import install_bundle, models_root
from radserve.models.manifest import load_manifest

SAYS = "labels is empty: a model needs at least one label"


@pytest.fixture
def unlabelled(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    folder = tmp_path / "src" / "organs-test" / "1.0.0"
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["labels"] = []
    manifest.pop("postprocess", None)  # it names the label
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    return folder


def test_a_manifest_without_labels_is_refused_naming_the_field(unlabelled: Path) -> None:
    with pytest.raises(ModelError) as refused:
        load_manifest(unlabelled / "model.yaml")
    assert SAYS in refused.value.message


def test_install_refuses_a_bundle_without_labels_and_keeps_nothing(
    unlabelled: Path, tmp_path: Path
) -> None:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(unlabelled, tmp_path / "data", host=CPU_HOST)
    assert SAYS in refused.value.message
    root = models_root(tmp_path / "data")
    assert not (root / "organs-test").exists()


def test_an_nnunet_dataset_of_the_background_alone_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / FOLDER
    (folder / "fold_0").mkdir(parents=True)
    (folder / "fold_0" / "checkpoint_final.pth").write_bytes(b"not read here")
    (folder / "plans.json").write_text(json.dumps(tiny_plans()))
    (folder / "dataset.json").write_text(
        json.dumps({**tiny_dataset(), "labels": {"background": 0}})
    )
    with pytest.raises(ImportRefusedError) as refused:
        manifest_from_nnunet(read_results_folder(folder), name="t", version="1")
    assert SAYS in refused.value.message
