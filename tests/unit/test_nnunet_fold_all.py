"""Which folds ``radserve models import nnunet`` ensembles without ``--fold``: nnU-Net's
own (``nnUNetPredictor.auto_detect_available_folds``: every fold_K, never fold_all
unless it is the only one). Before 2026-12-07 fold_all was averaged in beside
fold_0..k. And the dataset.json labels nnU-Net refuses, refused in one line naming what
is wrong (a duplicated value read "not consecutive"; a background not named
"background" ended in nnU-Net's 47-line traceback). No torch needed: JSON only."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.factories.nnunet_folder import CONFIG, FOLDER, tiny_dataset, tiny_plans

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import default_folds, manifest_from_nnunet, read_results_folder


def _folder(tmp_path: Path, folds: tuple[str, ...], dataset: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / FOLDER
    folder.mkdir()
    (folder / "plans.json").write_text(json.dumps(tiny_plans()))
    (folder / "dataset.json").write_text(json.dumps(dataset or tiny_dataset()))
    for f in folds:
        (folder / f"fold_{f}").mkdir()
        (folder / f"fold_{f}" / "checkpoint_final.pth").write_bytes(b"not read here")
    return folder


def test_fold_all_is_left_out_beside_the_cross_validation_folds(tmp_path, caplog):
    folder = _folder(tmp_path, ("0", "1", "2", "all"))
    with caplog.at_level(logging.WARNING, logger="radserve.importers.nnunet"):
        source = read_results_folder(folder)
    assert source.folds == ("0", "1", "2")
    assert source.folds_found == ("0", "1", "2", "all")
    assert "fold_all left out: folds 0, 1, 2 ensembled" in caplog.text
    assert "--fold all" in caplog.text
    spec = manifest_from_nnunet(source, name="t", version="1")
    assert "fold(s) 0, 1, 2 ensembled" in spec.description
    # asked for: taken alone, as nnU-Net's -f all
    assert read_results_folder(folder, folds=("all",)).folds == ("all",)
    assert read_results_folder(folder, folds=("0", "all")).folds == ("0", "all")


def test_fold_all_alone_is_taken(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="radserve.importers.nnunet"):
        source = read_results_folder(_folder(tmp_path, ("all",)))
    assert source.folds == ("all",) and "left out" not in caplog.text
    assert default_folds(["0", "4"]) == ("0", "4") and default_folds(["all"]) == ("all",)


def _refusal(tmp_path: Path, labels: dict[str, Any]) -> str:
    dataset = {**tiny_dataset(), "labels": labels}
    with pytest.raises(ImportRefusedError) as refused:
        manifest_from_nnunet(
            read_results_folder(_folder(tmp_path, ("0",), dataset)), name="t", version="1"
        )
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_duplicated_label_value_is_named(tmp_path):
    labels = {"background": 0, "liver": 1, "spleen": 2, "liver_tumour": 3, "tumour": 3}
    message = _refusal(tmp_path, labels)
    assert "label values are duplicated (3 is 'liver_tumour' and 'tumour')" in message
    assert "consecutive" not in message


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (
            {"Hintergrund": 0, "liver": 1, "spleen": 2},
            'need the background as "background": 0, the name nnU-Net requires (value 0 '
            "is named 'Hintergrund')",
        ),
        ({"background": [0], "liver": 1}, 'need the background as "background": 0'),
        ({"background": 0, "liver": "eins"}, "label 'liver' has the value 'eins'"),
        ({"background": 0, "liver": 1.5}, "label 'liver' has the value 1.5"),
        ({"background": 0, "liver": None}, "label 'liver' has the value None"),
    ],
)
def test_labels_nnunet_refuses_are_refused_in_one_line(tmp_path, labels, expected):
    assert expected in _refusal(tmp_path, labels)


def test_whole_numbers_written_otherwise_are_read_as_nnunet_reads_them(tmp_path):
    dataset = {**tiny_dataset(), "labels": {"background": "0", "liver": 1.0, "spleen": "2"}}
    spec = manifest_from_nnunet(
        read_results_folder(_folder(tmp_path, ("0",), dataset)), name="t", version="1"
    )
    assert {label.name: label.value for label in spec.labels} == {"liver": 1, "spleen": 2}


def test_a_mapped_model_yaml_refusal_is_one_line_per_problem(tmp_path):
    """pydantic's own text (a header, two lines per problem, a link) was printed."""
    plans = tiny_plans()
    plans["configurations"][CONFIG]["spacing"] = [2.0, -1.5, 1.5]
    folder = _folder(tmp_path, ("0",))
    (folder / "plans.json").write_text(json.dumps(plans))
    with pytest.raises(ImportRefusedError) as refused:
        manifest_from_nnunet(read_results_folder(folder), name="t", version="1")
    message = str(refused.value)
    assert message.startswith("the mapped model.yaml is invalid: input.spacing")
    assert "\n" not in message and "errors.pydantic.dev" not in message
