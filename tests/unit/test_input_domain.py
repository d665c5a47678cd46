"""The declared input domain (model.yaml ``input_domain``): coverage in mm instead of a
slice count, old bundles' ``slices`` still read, declarations validated, and the grid
``radserve evaluate --grid default`` builds from a declaration (issue 18)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from radserve.domain.accuracy import LESION_RECALL_FLOORS, ORGAN_MEAN_DICE_FLOOR
from radserve.domain.input_domain import (
    AcquisitionFacts,
    InputDomain,
    MeasuredStructure,
    domain_violations,
    output_unchecked,
    output_violations,
)
from radserve.evaluation.grid import (
    GridCell,
    domain_grid,
    floor_failures,
    parse_grid,
    tightest_domain,
)
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.phantom import PhantomSpec
from radserve.phantom.anatomy import NATIVE_HU, Tissue, hu_table


def chest(slices: int, thickness: float, step: float | None = None) -> AcquisitionFacts:
    return AcquisitionFacts("CT", 0.78, thickness, 512, 512, slices, "CHEST", step)


def test_coverage_is_slices_times_the_slice_step_else_the_thickness():
    assert chest(75, 5.0).coverage_mm == 375.0
    assert chest(150, 5.0, step=2.5).coverage_mm == 375.0  # overlapping reconstruction


def test_a_375_mm_study_at_5_mm_lies_inside_every_shipped_declaration():
    """The contradiction the old declaration had: 5 mm slices were allowed but 100-500
    slices were required, so 75 slices of 5 mm (375 mm) were flagged."""
    registry = ModelRegistry([bundled_model_dir()])
    bundles = [registry.get(n, v) for n in registry.names() for v in registry.versions(n)]
    assert bundles
    for bundle in bundles:
        domain = bundle.spec.input_domain
        assert domain is not None and domain.coverage_mm is not None, bundle.spec.key
        assert domain.slices is None, f"{bundle.spec.key} still declares a slice count"
        assert domain_violations(domain, "CT", chest(75, 5.0)) == [], bundle.spec.key
        reasons = domain_violations(domain, "CT", chest(40, 5.0))  # 200 mm
        assert reasons == [f"coverage 200 mm outside {domain.coverage_mm} mm"]


def test_an_old_bundles_slice_count_is_still_read_and_checked():
    domain = InputDomain.model_validate({"slices": {"min": 100, "max": 500}})
    assert domain_violations(domain, "CT", chest(75, 5.0)) == ["slices 75 outside [100, 500]"]
    assert domain_violations(domain, "CT", chest(300, 1.25)) == []


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"slices": {"min": 99.5}}, r"input_domain.slices: 99.5 is not a whole count"),
        ({"matrix": {"max": 512.2}}, r"input_domain.matrix: 512.2 is not a whole count"),
        ({"coverage_mm": {"max": 0}}, r"input_domain.coverage_mm: max 0 mm admits no study"),
        ({"coverage_mm": {"min": 500, "max": 290}}, r"range min 500.0 is above max 290.0"),
        ({"coverage": {"min": 290}}, r"coverage\s+Extra inputs are not permitted"),
        ({"slice_thickness_mm": {"min": -1}}, r"greater than or equal to 0"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_field(declared, message):
    with pytest.raises(ValidationError, match=message):
        InputDomain.model_validate(declared)


def test_the_default_grid_spans_the_tightest_declaration_and_just_past_it():
    organs = InputDomain.model_validate(
        {
            "pixel_spacing_mm": {"min": 0.6, "max": 0.9},
            "matrix": {"min": 512, "max": 512},
            "coverage_mm": {"min": 290, "max": 500},
        }
    )
    lesions = InputDomain.model_validate(
        {"pixel_spacing_mm": {"min": 0.5, "max": 0.8}, "slice_thickness_mm": {"max": 5}}
    )
    domain = tightest_domain([organs, None, lesions])
    assert domain is not None and str(domain.pixel_spacing_mm) == "[0.6, 0.8]"
    assert domain_grid(domain) == (
        "pixel_spacing=0.54,0.6,0.8,0.88;slice_thickness=5,5.5;matrix=448,576;"
        "coverage=261,290,500,550"
    )
    cells = parse_grid("default", domain=domain)
    assert cells[0] == GridCell() and GridCell("matrix", 448.0) in cells
    assert GridCell("matrix", 512.0) not in cells  # the only allowed matrix is the baseline
    assert GridCell("noise", 2.5) in cells and GridCell("hu_offset", 40.0) in cells
    assert GridCell("enhancement", 0.5) in cells
    assert GridCell("matrix", 576.0).label == "matrix=576"
    assert tightest_domain([None]) is None


def test_floor_failures_name_each_project_floor_missed():
    strata = ((">=10mm", 1.0, 9), ("5-10mm", None, 0))
    assert floor_failures(0.95, strata, 0.5, organs=True, lesions=True) == ()
    missed = floor_failures(
        0.85, ((">=10mm", 0.8, 10), ("5-10mm", 0.5, 4)), 2.0, organs=True, lesions=True
    )
    assert missed == (
        f"Dice 0.850 < {ORGAN_MEAN_DICE_FLOOR:.2f}",
        f"recall >=10mm 0.80 < {LESION_RECALL_FLOORS['>=10mm']:.2f} (10 lesions)",
        f"recall 5-10mm 0.50 < {LESION_RECALL_FLOORS['5-10mm']:.2f} (4 lesions)",
        "FP/study 2.00 > 1",
    )
    # a lesion-only pipeline is not judged on organ Dice
    assert floor_failures(None, strata, 0.0, organs=False, lesions=True) == ()


def test_a_whole_structure_far_from_its_declared_volume_is_flagged():
    domain = InputDomain.model_validate(
        {"structure_volumes_ml": {"liver": {"min": 500, "max": 5000}, "heart": {"min": 150}}}
    )
    measured = [
        MeasuredStructure("liver", "complete", 67.0),  # whole and tiny: unlike training
        MeasuredStructure("heart", "partial", 40.0),  # cut by the scan range: not judged
        MeasuredStructure("spleen", "complete", 5.0),  # not declared
        MeasuredStructure("kidney_left", "not_found", None),
    ]
    assert output_violations(domain, measured) == [
        "liver 67 ml (complete) outside the expected [500, 5000] ml: the images may not "
        "look like the studies the model was validated on"
    ]
    # a partial structure already above its range is flagged (the true volume is larger)
    assert output_violations(domain, [MeasuredStructure("liver", "partial", 6000.0)])
    assert output_violations(domain, [MeasuredStructure("liver", "complete", 1800.0)]) == []
    assert output_violations(None, measured) == []


def test_a_structure_whose_mean_hu_is_outside_its_declared_range_is_flagged():
    """The aorta's mean HU says the contrast phase: judged whole or partial, not when
    not found or not measured (MR)."""
    domain = InputDomain.model_validate({"structure_hu": {"aorta": {"min": 120}}})
    native = MeasuredStructure("aorta", "partial", 80.0, mean_hu=52.4)
    assert output_violations(domain, [native]) == [
        "aorta reads 52 HU on average, outside the expected [120, inf] HU: another contrast "
        "phase (or none) than the model was validated on"
    ]
    enhanced = MeasuredStructure("aorta", "complete", 80.0, mean_hu=180.0)
    assert output_violations(domain, [enhanced]) == []
    assert output_violations(domain, [MeasuredStructure("aorta", "complete", 80.0)]) == []
    assert output_violations(domain, [MeasuredStructure("aorta", "not_found", None)]) == []
    # not found: neither inside nor outside, and the report says so
    assert output_unchecked(domain, [MeasuredStructure("aorta", "not_found", None)]) == [
        "aorta not found: the mean HU that shows the contrast phase not checked"
    ]
    assert output_unchecked(domain, [native]) == []
    assert output_unchecked(None, [native]) == []
    # one declared structure found is enough: a chest CT has an aorta but no kidneys
    two = InputDomain.model_validate(
        {"structure_hu": {"aorta": {"min": 175}, "kidney_left": {"min": 112}}}
    )
    no_kidney = MeasuredStructure("kidney_left", "not_found", None)
    assert output_unchecked(two, [enhanced, no_kidney]) == []
    assert output_unchecked(two, [no_kidney]) == [
        "aorta, kidney_left not found: the mean HU that shows the contrast phase not checked"
    ]


def test_structure_volumes_must_name_a_region_label_of_the_model():
    registry = ModelRegistry([bundled_model_dir()])
    manifest = registry.get("organs").spec.model_dump(mode="json", exclude_none=True)
    manifest["input_domain"]["structure_volumes_ml"] = {"livre": {"min": 500}}
    with pytest.raises(ValidationError, match=r"names 'livre', which is not a region label.*"
                       r"did you mean 'liver'\?"):  # fmt: skip
        ModelSpec.model_validate(manifest)


def test_the_enhancement_axis_draws_the_same_patient_with_less_contrast():
    """0 is a non-contrast CT: the enhancing tissues at their unenhanced HU, everything
    else (fat, lung, bone) and every draw of the seed unchanged."""
    assert parse_grid("enhancement=0,0.5")[1:] == [
        GridCell("enhancement", 0.0),
        GridCell("enhancement", 0.5),
    ]
    assert GridCell("enhancement", 0.5).label == "enhancement=0.5x"
    with pytest.raises(ValueError, match=r"'enhancement': values must be in 0\.\.2"):
        parse_grid("enhancement=3")
    enhanced, half, native = (hu_table(8, e) for e in (1.0, 0.5, 0.0))
    for tissue, unenhanced in NATIVE_HU.items():
        drawn = float(enhanced[tissue])
        assert float(half[tissue]) == pytest.approx((drawn + float(native[tissue])) / 2)
        assert abs(float(native[tissue]) - unenhanced) <= 40.0  # the seed's own jitter
    assert float(native[Tissue.AORTA]) < 100.0 < 200.0 < float(enhanced[Tissue.AORTA])
    others = [t for t in Tissue if t not in NATIVE_HU]
    assert [float(native[t]) for t in others] == [float(enhanced[t]) for t in others]
    with pytest.raises(ValueError, match=r"contrast_enhancement must be in 0\.\.2"):
        PhantomSpec(seed=1, contrast_enhancement=-0.1)
