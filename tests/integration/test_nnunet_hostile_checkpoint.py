"""An nnU-Net checkpoint is a pickle: ``radserve models import nnunet`` reads it with
``torch.load(weights_only=True)``, so a checkpoint whose pickle would run code is refused
before that code runs, and a checkpoint as nnU-Net's trainer writes it (optimizer state,
numpy float64 logging, ``torch.device``) still imports. Needs the ``nnunet`` extra."""

from __future__ import annotations

import pytest
from tests.factories.nnunet_folder import make_results_folder

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import import_nnunet, read_checkpoint, read_results_folder

torch = pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")


class _WritesAFile:
    """Unpickled, it opens (creates) ``path``: the code a hostile checkpoint runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_whose_pickle_runs_code_is_refused_before_it_runs(tmp_path):
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    path = folder / "fold_0" / "checkpoint_final.pth"
    saved = torch.load(path, weights_only=False)  # the test's own file
    marker = tmp_path / "ran"
    torch.save({**saved, "logging": _WritesAFile(str(marker))}, path)
    with pytest.raises(ImportRefusedError, match="could run code") as refused:
        import_nnunet(folder, tmp_path / "models")
    assert "(io.open)" in str(refused.value)  # the one global not allowed, named
    assert not marker.exists()
    assert not (tmp_path / "models").exists()


def test_a_checkpoint_as_nnunet_writes_it_loads_with_weights_only(tmp_path):
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    source = read_results_folder(folder)
    saved = read_checkpoint(source.folder / "fold_0" / "checkpoint_final.pth")
    assert saved["init_args"]["device"] == torch.device("cpu")
    assert float(saved["_best_ema"]) == 0.5
    assert saved["optimizer_state"]["state"]  # the momentum buffers came through


def test_a_pickle_that_is_not_a_trainer_checkpoint_is_refused(tmp_path):
    path = tmp_path / "checkpoint_final.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(ImportRefusedError, match="not an nnU-Net trainer checkpoint"):
        read_checkpoint(path)
    path.write_bytes(b"not a pickle")
    with pytest.raises(ImportRefusedError, match="is not a torch checkpoint"):
        read_checkpoint(path)
