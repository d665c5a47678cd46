"""An nnU-Net results folder is data an AI team is handed, and its plans.json names code:
nnU-Net locates ``network_class_name`` and each ``_kw_requires_import`` value (conv_op,
norm_op, dropout_op, nonlin) and calls them with the plans' arguments while it builds the
network. ``radserve models import nnunet`` builds only ``torch.nn.Module`` classes from
them, so a plans file naming ``subprocess.Popen`` or ``torch.hub.load`` is refused before
anything it names is called. Checkpoints that do not fit the plans (another network's
weights in one fold, a checkpoint without the trainer's fields) and networks whose
weights are NaN are refused by name, not with a traceback or as an import that labels
every study empty. Needs the ``nnunet`` extra."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.factories.nnunet_folder import make_results_folder

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import import_nnunet

torch = pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")

CONFIG = "3d_fullres"


def _edit_architecture(folder: Path, **changes: object) -> None:
    path = folder / "plans.json"
    plans = json.loads(path.read_text())
    architecture = plans["configurations"][CONFIG]["architecture"]
    for key, value in changes.items():
        if key in ("network_class_name", "_kw_requires_import"):
            architecture[key] = value
        else:
            architecture["arch_kwargs"][key] = value
    path.write_text(json.dumps(plans))


def _refused(folder: Path, models: Path, match: str) -> ImportRefusedError:
    with pytest.raises(ImportRefusedError, match=match) as refused:
        import_nnunet(folder, models)
    assert not models.exists()  # nothing half-written
    return refused.value


def test_a_plans_layer_that_is_not_a_module_is_never_called(tmp_path):
    """Before: ``nonlin: subprocess.Popen`` with ``nonlin_kwargs: {args: [touch, X]}``
    ran the command while the network was built (then failed on the Popen)."""
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    marker = tmp_path / "ran"
    _edit_architecture(
        folder, nonlin="subprocess.Popen", nonlin_kwargs={"args": ["touch", str(marker)]}
    )
    refusal = _refused(folder, tmp_path / "models", "'subprocess.Popen' is a class that is not")
    assert "arch_kwargs.nonlin" in str(refusal)
    assert not marker.exists()


def test_a_plans_network_class_that_is_a_function_is_never_called(tmp_path):
    """Before: ``network_class_name: torch.hub.load`` with ``source: local`` imported the
    ``hubconf.py`` shipped beside the plans (its top level ran) and called its entry
    point, which could hand back a working network: the import succeeded."""
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    marker = tmp_path / "ran"
    (folder / "hubconf.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n\n\ndef net(**kw):\n"
        "    raise RuntimeError('the hub entry ran')\n"
    )
    _edit_architecture(
        folder,
        network_class_name="torch.hub.load",
        _kw_requires_import=[],
        repo_or_dir=str(folder),
        model="net",
        source="local",
    )
    _refused(folder, tmp_path / "models", "'torch.hub.load' is a function, not a class")
    assert not marker.exists()


def test_a_fold_whose_weights_do_not_fit_the_plans_is_refused_naming_it(tmp_path):
    """fold_1 holds the checkpoint of a smaller network (4..16 features, the plans say
    8..32): before, torch's RuntimeError ended the command with a traceback."""
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    other = make_results_folder(tmp_path / "other", folds=(1,), features=(4, 8, 16))
    shutil.copytree(other / "fold_1", folder / "fold_1")
    refusal = _refused(folder, tmp_path / "models", "fold_1/checkpoint_final.pth: its weights")
    assert "size mismatch" in str(refusal)


def test_a_checkpoint_without_the_trainer_fields_is_refused(tmp_path):
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    path = folder / "fold_0" / "checkpoint_final.pth"
    saved = torch.load(path, weights_only=False)  # the test's own file
    torch.save({"network_weights": saved["network_weights"]}, path)
    _refused(folder, tmp_path / "models", "no trainer_name or init_args.configuration")


def test_a_network_whose_weights_are_nan_is_refused(tmp_path):
    """NaN segmentation-head weights: every logit NaN. Before, the export check compared
    NaN with NaN (false: no difference found) and imported a model whose every study
    came out empty."""
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    path = folder / "fold_0" / "checkpoint_final.pth"
    saved = torch.load(path, weights_only=False)  # the test's own file
    weights = saved["network_weights"]
    for key in [k for k in weights if "seg_layers" in k]:
        weights[key] = weights[key] * float("nan")
    torch.save(saved, path)
    _refused(folder, tmp_path / "models", "hold NaN or infinite values")
