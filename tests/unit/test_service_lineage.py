"""Lesion matching across result generations: same finding type, centroid within
max(10 mm, either long axis), nearest pairs first, each lesion used once."""

from __future__ import annotations

from radserve.domain import CodedConcept, Finding
from radserve.service.lineage import match_findings

LESION = CodedConcept(value="52988006", meaning="Lesion")
CYST = CodedConcept(value="441457006", meaning="Cyst")


def _finding(n: int, centroid: tuple[float, float, float], *, size: float = 8.0, concept=LESION):
    return Finding(
        finding_id=n, label="lesion", concept=concept, label_value=n, volume_ml=1.0,
        longest_diameter_mm=size, short_axis_mm=size / 2, centroid_mm=centroid,
        centroid_voxel=(0.0, 0.0, 0.0), key_slice_index=0, confidence=0.9,
        model="m", model_version="1",
    )  # fmt: skip


def test_each_lesion_keeps_its_nearest_predecessor() -> None:
    previous = [_finding(1, (0, 0, 0)), _finding(2, (50, 0, 0))]
    # renumbered, moved by a few mm (more slices), and one new lesion far away
    current = [_finding(1, (52, 1, 0)), _finding(2, (3, 0, 2)), _finding(3, (0, 90, 0))]
    assert match_findings(current, previous) == {1: 2, 2: 1}


def test_no_match_across_finding_types_or_beyond_the_lesion_size() -> None:
    previous = [_finding(1, (0, 0, 0)), _finding(2, (100, 0, 0), size=30.0)]
    current = [_finding(1, (0, 0, 1), concept=CYST), _finding(2, (125, 0, 0), size=5.0)]
    assert match_findings(current, previous) == {2: 2}  # 25 mm < its 30 mm long axis
    assert match_findings([_finding(1, (11, 0, 0))], [_finding(1, (0, 0, 0))]) == {}


def test_two_candidates_for_one_predecessor_the_nearer_wins() -> None:
    previous = [_finding(1, (0, 0, 0))]
    current = [_finding(1, (6, 0, 0)), _finding(2, (2, 0, 0))]
    assert match_findings(current, previous) == {2: 1}
