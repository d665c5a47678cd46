"""Key images: size, radiological orientation and the finding drawn where it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tests.factories.findings import ellipsoid, label, prediction, spec

from radserve.domain import Volume
from radserve.postprocess import find_lesions
from radserve.report import render_finding, render_overview, write_key_images
from radserve.report.keyimages import DisplayTransform

SHAPE, SPACING = (10, 48, 64), (2.5, 0.9, 0.6)  # non-square pixels: 43.2 x 38.4 mm
LESIONS = spec([label(1, "liver lesion", "lesion")], name="lesions")


def _case(affine: np.ndarray):
    mask = ellipsoid(SHAPE, SPACING, (5, 14, 12), (5, 5, 5))  # low row and column index
    pred = prediction(mask * 1, affine, mask * 255)
    ct = pred.labels.with_array(np.where(mask, 60.0, 0.0).astype(np.float32))
    organs = pred.labels.with_array(np.ones(SHAPE, np.uint8))
    lesions = find_lesions(pred, ct, LESIONS)
    return ct, organs, lesions


def _redness(image: Image.Image, x: float, y: float) -> int:
    r, g, _ = image.getpixel((int(x), int(y)))
    return int(r) - int(g)


def _standard() -> np.ndarray:
    return Volume.from_geometry(np.zeros(SHAPE), spacing=SPACING).affine


def _columns_to_patient_right() -> np.ndarray:
    affine = _standard()
    affine[:3, 2] *= -1
    return affine


def _transposed() -> np.ndarray:
    affine = _standard()
    affine[:3, [1, 2]] = affine[:3, [2, 1]]  # rows run left, columns posterior
    return affine


@pytest.mark.parametrize(
    ("affine", "finding_on_left"),
    [(_standard(), True), (_columns_to_patient_right(), False), (_transposed(), True)],
)
def test_finding_is_drawn_where_it_lies_in_the_patient(affine, finding_on_left) -> None:
    ct, _, lesions = _case(affine)
    [f] = lesions.findings
    image = render_finding(ct, f, lesions.label_map, size=512)
    t = DisplayTransform.for_volume(ct, 512)
    assert image.size == (t.width, t.height) and max(image.size) == 512
    x, y = t.to_display(*f.centroid_voxel[1:])
    assert (x < image.width / 2) == finding_on_left
    assert _redness(image, x, y) > 40  # the semi-transparent overlay
    assert _redness(image, image.width - 1 - x, y) <= 0  # mirror position: grey


def test_standard_axial_stack_is_displayed_as_is() -> None:
    t = DisplayTransform.for_volume(Volume.from_geometry(np.zeros(SHAPE), spacing=SPACING), 512)
    assert not (t.transpose or t.flip_h or t.flip_v)
    assert (t.left, t.top) == ("R", "A")
    assert t.height == 512 and t.width == round(512 * (64 * 0.6) / (48 * 0.9))


def test_write_key_images(tmp_path: Path) -> None:
    ct, organs, lesions = _case(_standard())
    outputs = write_key_images(
        tmp_path,
        ct,
        lesions.findings,
        lesions.label_map,
        axes=lesions.axes,
        organ_labels=organs,
        organ_colors={1: (0, 200, 0)},
        size=200,
    )
    assert [o.path for o in outputs] == ["keyimages/overview.png", "keyimages/finding-001.png"]
    assert outputs[1].finding_id == 1 and outputs[1].slice_index == 5
    for o in outputs:
        with Image.open(tmp_path / o.path) as image:
            assert image.mode == "RGB" and max(image.size) == 200
    # the files hold the rendered pixels (PNG is lossless at any zlib level)
    overview, _ = render_overview(
        ct,
        organ_labels=organs,
        organ_colors={1: (0, 200, 0)},
        finding_labels=lesions.label_map,
        size=200,
    )
    with Image.open(tmp_path / outputs[0].path) as image:
        np.testing.assert_array_equal(np.asarray(image), np.asarray(overview))


def test_overview_shows_the_slice_with_most_organ_voxels_else_findings_else_the_middle() -> None:
    ct = Volume.from_geometry(np.zeros(SHAPE, np.float32), spacing=SPACING)
    organs = np.zeros(SHAPE, np.uint8)
    organs[3, :5, :5] = 2  # 25 voxels
    organs[7, :6, :6] = 1  # 36 voxels: the most
    findings = np.zeros(SHAPE, np.uint8)
    findings[1, :2, :2] = 1
    _, z = render_overview(ct, organ_labels=ct.with_array(organs), size=64)
    assert z == 7
    empty = ct.with_array(np.zeros(SHAPE, np.uint8))
    _, z = render_overview(ct, organ_labels=empty, finding_labels=ct.with_array(findings), size=64)
    assert z == 1
    _, z = render_overview(ct, organ_labels=empty, finding_labels=empty, size=64)
    assert z == SHAPE[0] // 2


@pytest.mark.parametrize("seed", range(4))
def test_an_overlay_drawn_in_its_box_is_the_whole_image_overlay(seed: int) -> None:
    """The overlay works inside the mask's box: the same image as blending and
    outlining over the whole canvas, masks at the image's edges too."""
    from scipy import ndimage

    from radserve.report.keyimages import _Canvas

    rng = np.random.default_rng(seed)
    t = DisplayTransform.for_volume(Volume(np.zeros(SHAPE), _standard()), 96)
    canvas = _Canvas(t, rng.integers(0, 256, (SHAPE[1], SHAPE[2])).astype(np.uint8))
    want = canvas.rgb.copy()
    for alpha, outline in ((0.3, True), (0.0, True), (0.5, False)):
        mask = ndimage.binary_opening(rng.random(canvas.rgb.shape[:2]) < 0.5)
        mask[: rng.integers(0, 30)] = False  # a box that touches some edges, not others
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        canvas.overlay(mask, color, alpha, outline)
        col = np.asarray(color, dtype=np.float32)
        if alpha > 0:
            want[mask] = (1 - alpha) * want[mask] + alpha * col
        if outline:
            want[mask & ~ndimage.binary_erosion(mask, iterations=1, border_value=0)] = col
        np.testing.assert_array_equal(canvas.rgb, want)


def test_key_images_replace_their_files_whole_and_leave_no_temporaries(tmp_path: Path) -> None:
    """A reader that opened a key image (the console, WADO) keeps reading the whole old
    file while a new one is written: the PNG goes to a temporary that is renamed over its
    name, never truncated and rewritten in place."""
    ct, organs, lesions = _case(_standard())
    args = (ct, lesions.findings, lesions.label_map)
    write_key_images(tmp_path, *args, axes=lesions.axes, organ_labels=organs, size=200)
    folder = tmp_path / "keyimages"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    held = {name: open(folder / name, "rb") for name in before}  # noqa: SIM115
    try:
        write_key_images(tmp_path, *args, axes=lesions.axes, organ_labels=organs, size=120)
        for name, handle in held.items():
            assert handle.read() == before[name], f"{name} changed under an open reader"
    finally:
        for handle in held.values():
            handle.close()
    assert sorted(p.name for p in folder.iterdir()) == sorted(before)  # no temporaries
    for name in before:
        with Image.open(folder / name) as image:
            image.load()  # whole: decodes to the end
            assert max(image.size) == 120


def test_a_finding_s_caption_names_it_and_its_organ_by_their_concepts() -> None:
    """The lines burnt into a key image (and its Secondary Capture) read as the SR and the
    FHIR text do: "#1 Liver lesion in liver", not the models' labels ("#1 lesion
    (liver_left_lobe)"); an organ without a concept reads with spaces."""
    from radserve.domain import CodedConcept
    from radserve.report.keyimages import finding_caption

    ct, organs, lesions = _case(_standard())
    named = find_lesions(
        prediction(lesions.label_map.array > 0, _standard(), lesions.label_map.array * 0 + 255),
        ct,
        LESIONS,
        organ_labels=organs,
        organ_names={1: "liver_left_lobe"},
    )
    [f] = named.findings
    assert f.containing_organ == "liver_left_lobe"
    site = {"liver_left_lobe": CodedConcept(value="10200004", meaning="Liver")}
    first, size, where = finding_caption(f, site, 4, 10)
    assert first == f"#{f.finding_id} {f.concept.meaning} in liver"
    assert "mm" in size and where == "slice 5/10"
    assert finding_caption(f, {}, 4, 10)[0].endswith(" in liver left lobe")
