"""``radserve evaluate --grid``: metric per acquisition cell and the declared input domain."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.petct import write_petct_bundle, write_petct_pipeline

from radserve.cli import cli
from radserve.evaluation.grid import GridCell, evaluate_grid, parse_grid
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import load_pipeline

FIELDS = {
    "cell", "axis", "value", "n_studies", "dice_mean", "lesion_recall", "n_lesions",
    "fp_per_study", "in_domain", "domain_declared", "violations", "recall_by_floor_stratum",
    "floors_met", "floor_failures", "studies_flagged_by_structures",
}  # fmt: skip


def test_a_grid_is_the_baseline_plus_one_cell_per_value():
    cells = parse_grid("slice_thickness=1.25, 5; hu_offset=-40")
    assert cells == [
        GridCell(),
        GridCell("slice_thickness", 1.25),
        GridCell("slice_thickness", 5.0),
        GridCell("hu_offset", -40.0),
    ]
    assert [c.label for c in cells[1:]] == ["slice_thickness=1.25 mm", "slice_thickness=5 mm",
                                            "hu_offset=-40 HU"]  # fmt: skip
    assert GridCell("suv_scale", 0.8) in parse_grid("default", pet=True)
    assert GridCell("suv_scale", 0.8) not in parse_grid("default")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("thickness=2", r"unknown grid axis 'thickness'; choose from slice_thickness"),
        ("noise=0", r"values must be positive"),
        ("noise", r"bad grid axis 'noise'"),
        # typos that would have run the baseline alone, or an axis without a cell
        (" ; ", r"no grid axis in ' ; '; expected e\.g\. 'slice_thickness=1\.25,5' or 'default'"),
        ("hu_offset=,", r"grid axis 'hu_offset' has no values; expected e\.g\. 'hu_offset=1,2'"),
    ],
)
def test_a_bad_grid_is_refused_with_what_was_expected(text, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(text)


@pytest.fixture(scope="module")
def ct_models(tmp_path_factory):
    """The threshold test bundles, the organ model declaring slices up to 3 mm."""
    root = tmp_path_factory.mktemp("grid")
    models = write_test_bundles(root / "models")
    path = models / "organs-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest["input_domain"] = {"slice_thickness_mm": {"max": 3.0}}
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return models, write_test_pipeline(root / "pipelines")


def test_each_cell_is_scored_and_judged_against_the_declared_domain(ct_models):
    models, pipeline = ct_models
    rows = evaluate_grid(
        ModelRegistry([models]),
        load_pipeline(pipeline),
        cells=parse_grid("slice_thickness=2.5;noise=2"),
        seeds=[0],
        small=True,
    )
    by_cell = {r.cell.label: r for r in rows}
    assert list(by_cell) == ["baseline", "slice_thickness=2.5 mm", "noise=2x"]
    # small phantoms have 5 mm slices: outside the declared 3 mm, the 2.5 mm cell inside
    assert not by_cell["baseline"].in_domain
    assert by_cell["baseline"].violations == (
        "organs-test: slice thickness 5 mm outside [-inf, 3] mm",
    )
    assert by_cell["slice_thickness=2.5 mm"].in_domain
    assert by_cell["noise=2x"].undeclared and not by_cell["noise=2x"].in_domain
    for row in rows:
        assert row.n_studies == 1 and row.n_lesions == 5
        assert row.dice_mean is not None and 0.0 <= row.dice_mean <= 1.0
        assert row.lesion_recall is not None and row.fp_per_study >= 0
        assert set(row.to_dict()) == FIELDS
        # the floors are judged on every cell; a miss is named
        assert row.floors_met == (not row.failures)
        assert all(" < " in f or " > " in f for f in row.failures)
        assert [name for name, _, _ in row.recall_floor_strata] == [">=10mm", "5-10mm"]


def test_a_declared_fat_range_makes_the_hu_offset_a_declared_axis(tmp_path):
    """The lesion test model declares where fat reads; each study's fat is measured from
    its pixels (seed 0 draws it at -92 HU, seed 1 at -110), so a +30 HU offset flags only
    the seed whose fat it moves past -75, and the table says which and how many."""
    models = write_test_bundles(tmp_path / "models")
    path = models / "lesions-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest["input_domain"] = {"fat_hu": {"min": -125.0, "max": -75.0}}
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    rows = evaluate_grid(
        ModelRegistry([models]),
        load_pipeline(write_test_pipeline(tmp_path / "pipelines")),
        cells=parse_grid("hu_offset=30,-40;noise=2"),
        seeds=[0, 1],
        small=True,
    )
    by_cell = {r.cell.label: r for r in rows}
    assert by_cell["baseline"].in_domain and not by_cell["baseline"].undeclared
    plus = by_cell["hu_offset=30 HU"]
    assert not plus.undeclared and not plus.in_domain
    assert plus.violations == (
        "lesions-test: fat reads -62 HU in 1 of 2 studies, outside [-125, -75] HU: the CT "
        "numbers may be miscalibrated",
    )
    minus = by_cell["hu_offset=-40 HU"]
    assert minus.violations == (
        "lesions-test: fat reads -150 to -132 HU in 2 of 2 studies, outside [-125, -75] HU: "
        "the CT numbers may be miscalibrated",
    )
    # noise is still no declared axis: the fat peak does not move with it
    assert by_cell["noise=2x"].undeclared and by_cell["noise=2x"].in_domain


def test_the_suv_scale_axis_moves_a_pet_ct_models_recall(tmp_path):
    models = write_petct_bundle(tmp_path / "models")
    rows = evaluate_grid(
        ModelRegistry([models]),
        load_pipeline(write_petct_pipeline(tmp_path)),
        cells=parse_grid("suv_scale=0.3"),
        seeds=[0],
        small=True,
    )
    baseline, scaled = rows
    assert baseline.lesion_recall is not None and baseline.lesion_recall > 0
    # SUV x 0.3: every lesion (SUV 4-12 -> 1.2-3.6) falls below the model's 3.75
    assert scaled.lesion_recall == 0.0
    assert scaled.in_domain and scaled.undeclared


def test_the_command_prints_the_table_and_writes_every_field(ct_models, tmp_path):
    models, pipeline = ct_models
    out = tmp_path / "grid.json"
    markdown = tmp_path / "grid.md"
    args = [
        "evaluate", "--grid", "hu_offset=40", "--seeds", "0", "--small",
        "--pipeline", str(pipeline), "--models-dir", str(models),
        "--json", str(out), "--markdown", str(markdown),
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "in domain" in result.output and "baseline" in result.output
    data = json.loads(out.read_text())
    assert [c["cell"] for c in data["cells"]] == ["baseline", "hu_offset=40 HU"]
    assert all(set(c) == FIELDS for c in data["cells"])
    assert markdown.read_text().startswith("| cell | studies | Dice (mean) |")
    assert "| floors met | in domain |" in markdown.read_text()
    assert "hu_offset=40 HU seed 0 (1/1):" in result.output  # one progress line a study
    assert "GT lesions found" in result.output
    bad = CliRunner().invoke(cli, ["evaluate", "--grid", "fov=-1", "--pipeline", str(pipeline),
                                   "--models-dir", str(models)])  # fmt: skip
    assert bad.exit_code == 2 and "values must be positive" in bad.output
