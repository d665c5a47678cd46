"""`radserve evaluate` says when its phantoms lie outside the models' declared input domain.

`radserve evaluate --small` was offered as a "quick check" and printed its scores (46
false positives per study on seed 0) with nothing to say that 128x128 phantoms with
2.6-3 mm pixels are outside what the reference models declare (docs/evaluate-grid.md);
a reader trying the README took them for the models' accuracy. The bundled models'
declarations and the real phantoms are used; the predictor is a stand-in that finds
nothing (the note is about the inputs, not the outputs).
"""

from __future__ import annotations

import numpy as np
import pytest

from radserve.commands.evaluate import DEFAULT_PIPELINE, pipeline_specs
from radserve.domain.volume import Volume
from radserve.evaluation.grid import phantom_domain_violations
from radserve.evaluation.pipeline_runs import organ_label_values
from radserve.evaluation.runner import evaluate
from radserve.models.registry import ModelRegistry, bundled_model_dir


@pytest.fixture(scope="module")
def specs():
    return pipeline_specs(ModelRegistry([bundled_model_dir()]), DEFAULT_PIPELINE)


def _finds_nothing(ct: Volume, precision: str):
    empty = np.zeros(ct.shape, np.uint8)
    return empty, empty, []


def test_small_phantoms_are_named_outside_the_declared_input_domain(specs) -> None:
    summaries = evaluate(
        _finds_nothing,
        seeds=[0, 1],
        organ_labels=organ_label_values(specs),
        small=True,
        outside_domain=lambda ct: phantom_domain_violations(specs, ct),
    )
    notes = [n for n in summaries["fp32"].notes if "input_domain" in n]
    assert len(notes) == 1
    assert notes[0].startswith("2 of 2 phantoms lie outside the models' declared input_domain")
    assert "organs: rows 128 outside [512, 512]" in notes[0]
    assert notes[0].endswith("their scores are not the models' accuracy")


def test_a_full_size_chest_abdomen_grid_is_inside(specs) -> None:
    ct = Volume.from_geometry(np.zeros((150, 512, 512), np.int16), spacing=(2.5, 0.78, 0.78))
    assert phantom_domain_violations(specs, ct) == []
    thin = Volume.from_geometry(np.zeros((150, 512, 512), np.int16), spacing=(0.5, 0.78, 0.78))
    assert phantom_domain_violations(specs, thin) == [
        "organs: slice thickness 0.5 mm outside [0.625, 5] mm",
        "organs: coverage 75 mm outside [290, 500] mm",
        "lesions: slice thickness 0.5 mm outside [0.625, 5] mm",
        "lesions: coverage 75 mm outside [290, 500] mm",
    ]


def test_organs_are_scored_by_the_organ_steps_own_label_values(specs):
    """The organ map scored is the last model with region labels' (VolumeResult.
    organ_step). An earlier model's organs must not lend it their names and values: they
    were merged, so an organ only the earlier model names (value 99 here) was scored on
    voxels of the organ step's map that mean something else, or nothing."""
    organs = next(s for s in specs if s.region_labels)
    liver = next(lb for lb in organs.labels if lb.name == "liver")
    earlier = organs.model_copy(
        update={
            "name": "earlier-organs",
            "labels": (*organs.labels, liver.model_copy(update={"name": "pancreas", "value": 99})),
        }
    )
    assert organ_label_values([earlier, organs]) == organ_label_values([organs])
    assert "pancreas" not in organ_label_values([earlier, organs])
    assert organ_label_values([organs, earlier])["pancreas"] == 99  # it is the organ step
    assert organ_label_values([s for s in specs if not s.region_labels]) == {}
