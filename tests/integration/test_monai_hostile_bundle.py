"""A MONAI bundle is data an AI team is handed: ``radserve models import monai-bundle``
refuses by name what would stop in a debugger, run code or write a bundle that can never
serve, and leaves nothing in the models folder.

* ``_debug_: true`` or ``_mode_: debug`` on a component: MONAI enters pdb, which waits at
  a ``(Pdb)`` prompt and first runs a ``.pdbrc`` of the current folder (Python
  statements included): a bundle imported from its own folder ran the one it shipped;
* ``_mode_: callable``: MONAI hands back a ``functools.partial``, which ended the import
  with an AttributeError traceback;
* ``models/model.pt`` whose pickle names code: torch's own refusal ended the import with
  a traceback advising ``weights_only=False``;
* a network of 5 output channels beside a ``channel_def`` of 3 was imported, to be
  refused by every install and run.

Needs the ``monai`` extra."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.factories.monai_bundle import NETWORK, write_monai_bundle
from tests.factories.server_process import radserve_command

from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import import_monai

pytest.importorskip("monai", reason="the monai extra is not installed")
torch = pytest.importorskip("torch", reason="the monai extra (torch) is not installed")


def _edit_network_def(bundle: Path, **options: object) -> None:
    path = bundle / "configs" / "inference.json"
    config = json.loads(path.read_text())
    config["network_def"].update(options)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("option", [{"_debug_": True}, {"_mode_": "debug"}])
def test_a_component_asking_for_the_debugger_is_refused_and_no_pdbrc_runs(tmp_path, option):
    """Imported from the bundle's own folder, as a user types it there; before, the
    ``.pdbrc`` shipped in the bundle ran (its Python wrote the marker) and, with no
    terminal, the import went on to succeed."""
    bundle = write_monai_bundle(tmp_path / "bundle")
    _edit_network_def(bundle, **option)
    marker = tmp_path / "ran"
    (bundle / ".pdbrc").write_text(
        f"import pathlib; pathlib.Path({str(marker)!r}).touch()\ncontinue\n"
    )
    done = subprocess.run(
        radserve_command(
            *("models", "import", "monai-bundle", "."),
            *("--models-dir", str(tmp_path / "models")),
        ),
        cwd=bundle,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HOME": str(tmp_path / "home")},  # no ~/.pdbrc of the user
    )
    assert not marker.exists()
    assert done.returncode != 0
    assert "'network_def'" in done.stderr and "debugger" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "models").exists()


def test_a_component_built_as_a_callable_is_refused(tmp_path):
    bundle = write_monai_bundle(tmp_path / "bundle")
    _edit_network_def(bundle, _mode_="callable")
    with pytest.raises(ImportRefusedError, match="has _mode_ 'callable'"):
        import_monai(bundle, tmp_path / "models")
    assert not (tmp_path / "models").exists()


class _WritesAFile:
    """Unpickled, it opens (creates) ``path``: the code a hostile weights file runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_weights_whose_pickle_runs_code_are_refused_naming_it(tmp_path):
    bundle = write_monai_bundle(tmp_path / "bundle")
    weights = bundle / "models" / "model.pt"
    marker = tmp_path / "ran"
    state = torch.load(weights, weights_only=True)
    torch.save({**state, "extra": _WritesAFile(str(marker))}, weights)
    with pytest.raises(ImportRefusedError, match="could run code") as refused:
        import_monai(bundle, tmp_path / "models")
    assert "io.open" in str(refused.value)
    assert "weights_only" not in str(refused.value)  # never the advice to load it unsafely
    assert not marker.exists()
    assert not (tmp_path / "models").exists()


def test_a_network_with_more_outputs_than_labels_is_refused(tmp_path):
    """metadata.json's channel_def names 3 channels (background, liver, spleen); the
    network has 5 output channels."""
    bundle = write_monai_bundle(tmp_path / "bundle", network={**NETWORK, "out_channels": 5})
    with pytest.raises(ImportRefusedError, match="has 5 channels; the manifest implies 3"):
        import_monai(bundle, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_a_network_that_downloads_pretrained_weights_is_refused_offline(tmp_path):
    """MONAI's EfficientNetBN downloads ImageNet weights as it is built (``pretrained``
    is its default): the import reached out to the network (here, with none, it ended
    in a resolver error; on a hospital machine with a route out it would have
    downloaded). Now no lookup or connection is made and the refusal says why."""
    bundle = write_monai_bundle(tmp_path / "bundle")
    path = bundle / "configs" / "inference.json"
    config = json.loads(path.read_text())
    config["network_def"] = {
        "_target_": "monai.networks.nets.EfficientNetBN",
        "model_name": "efficientnet-b0",
        "pretrained": True,
        "spatial_dims": 2,
        "in_channels": 3,
        "num_classes": 1000,
    }
    path.write_text(json.dumps(config))
    with pytest.raises(ImportRefusedError, match="reaches the network while it is built"):
        import_monai(bundle, tmp_path / "models")
    assert not (tmp_path / "models").exists()
