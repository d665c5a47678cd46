"""Lesion training data: slices through every lesion, per-lesion and hard-negative patches.

No torch here: the data builder and the sampler are numpy only.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from radserve.training import data
from radserve.training.recipes import RECIPES


@pytest.fixture(scope="module")
def lesion_set():
    recipe = RECIPES["lesions"]
    arrays = data.load_phantom(2, small=True, n_lesions=10)
    part = data.phantom_slices(recipe, arrays, 20, np.random.default_rng(0))
    part.seeds = [2] * len(part)
    return recipe, arrays, part


def test_every_visible_lesion_has_its_largest_section_in_the_set(lesion_set):
    recipe, arrays, part = lesion_set
    assert len(part.instances) == len(part.hard) == len(part) > 0
    assert part.images[0].shape[0] == recipe.spec.input.in_channels == 5
    seen = set().union(*(set(np.unique(i).tolist()) for i in part.instances)) - {0}
    painted = set(np.unique(arrays.lesion_instances).tolist()) - {0}
    # A lesion thinner than a resampled pixel may vanish from the model grid.
    assert len(seen) >= len(painted) - 1 and seen <= painted
    for ins, lab in zip(part.instances, part.labels, strict=True):
        assert np.array_equal(ins > 0, lab > 0)
    assert any((h == data.HARD_VESSEL).any() for h in part.hard)
    assert any((h == data.HARD_LIVER).any() for h in part.hard)


def test_lesion_sampler_draws_each_lesion_alike_and_hard_negatives(lesion_set):
    recipe, _arrays, part = lesion_set
    settings = dataclasses.replace(recipe.train, patch=32, hard_negative_fraction=0.0)
    sampler = data.LesionPatchSampler(
        part, dataclasses.replace(recipe, train=settings), np.random.default_rng(0)
    )
    hits = {key: 0 for key in sampler.lesion_keys}
    for _ in range(400):
        i, centre = sampler._lesion_centre()
        lesion_id = int(part.instances[i][centre])
        if lesion_id:
            hits[(2, lesion_id)] += 1
    counts = np.array(list(hits.values()))
    assert counts.min() > 0 and counts.max() < 4 * counts.mean()
    x, y = sampler.batch(8)
    assert x.shape == (8, 5, 32, 32) and y.shape == (8, 32, 32) and x.dtype == np.float32
    assert (y > 0).any(axis=(1, 2)).sum() >= 2  # about half the patches hold a lesion
    i, (row, col) = sampler._hard_centre() or (0, (0, 0))
    assert part.hard[i][row, col] in (data.HARD_VESSEL, data.HARD_LIVER)


def test_organ_recipe_phantoms_are_unchanged():
    organs = RECIPES["organs"].train
    for seed in (1188, 3538, 950):
        n, cap = data.phantom_variant(seed, organs)
        expected = data.training_lesion_count(seed) if seed >= 1000 else None
        assert (n, cap) == (expected, None)


def test_choose_rules_keeps_the_fp_budget_and_prefers_small_lesion_recall():
    from radserve.evaluation.lesions import LesionOutcome
    from radserve.training.validate import LesionSweep, PipelineSweep, choose_rules

    def outcome(d: float, hit: bool) -> LesionOutcome:
        return LesionOutcome(1, d, "lung_solid", "5-10", 1 if hit else None)

    sweeps = []
    for fps in ([3, 1, 0], [2, 1, 0]):  # one study; thresholds 0.3, 0.5, 0.9
        s = LesionSweep(thresholds=[0.3, 0.5, 0.9])
        hits = [[True, True], [True, True], [False, True]]
        s.add([[outcome(6.0, a), outcome(15.0, b)] for a, b in hits], fps)
        sweeps.append(s)
    chosen = choose_rules(PipelineSweep([0.0, 0.05], sweeps), max_fp_per_study=1.0)
    assert chosen["fp_per_study"] <= 1.0
    assert chosen["min_confidence"] == 0.5 and chosen["recall"]["5-10mm"] == 1.0
    # Nothing within budget: the strictest rules.
    strict = choose_rules(PipelineSweep([0.0, 0.05], sweeps), max_fp_per_study=-1.0)
    assert (strict["min_component_ml"], strict["min_confidence"]) == (0.05, 0.9)
