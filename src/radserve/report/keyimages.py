"""PNG key images: one per finding (its key slice) and one overview.

Images follow radiological display convention whatever the acquisition: an axial slice
shows patient right on the image left and anterior at the top; coronal shows right on
the left and head at the top; sagittal shows anterior on the left and head at the top.
The orientation is read from the affine (nearest anatomical axis for oblique planes),
so flipped or transposed stacks display the same way. Pixels are resampled to square
display pixels, so non-square acquisitions keep their physical aspect ratio.

The images carry no patient data: finding id, label, diameters, slice number, a scale
bar and orientation letters only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

from radserve import durable
from radserve.checkpoints import checkpoint
from radserve.domain import CodedConcept, Finding, Volume
from radserve.errors import ReportError
from radserve.postprocess.diameters import FindingAxes
from radserve.report.schema import KeyImageOutput
from radserve.report.wording import site_text

logger = logging.getLogger(__name__)

Color = tuple[int, int, int]
_Font = ImageFont.ImageFont | ImageFont.FreeTypeFont

# LPS unit vectors -> the letter of the direction they point to.
_LETTERS = {(0, 1): "L", (0, -1): "R", (1, 1): "P", (1, -1): "A", (2, 1): "H", (2, -1): "F"}


@dataclass(frozen=True)
class Window:
    """CT display window in HU."""

    center: float
    width: float


PNG_LEVEL = 1
"""zlib level of the key images' PNG files. Pillow's default (6) took 18 CPU-ms for a
512 x 512 overview of the 300-slice phantom, level 1 6.4 ms, and its file was smaller
(103 against 111 KB): the images are flat colours over a smooth CT slice."""

LUNG_WINDOW = Window(-600.0, 1500.0)
SOFT_TISSUE_WINDOW = Window(40.0, 400.0)


@dataclass(frozen=True)
class DisplayTransform:
    """Maps a slice's (row, column) array to screen pixels in radiological convention."""

    transpose: bool  # screen horizontal runs along array rows
    flip_h: bool
    flip_v: bool
    n_h: int
    n_v: int
    width: int
    height: int
    mm_per_pixel: float
    left: str  # orientation letters at the left and top edges
    top: str

    @classmethod
    def for_volume(cls, volume: Volume, size: int = 512) -> DisplayTransform:
        row_vec, col_vec = volume.affine[:3, 1], volume.affine[:3, 2]
        normal = np.cross(row_vec, col_vec)
        plane = int(np.argmax(np.abs(normal)))
        # screen-right and screen-down directions in LPS for axial, coronal, sagittal
        right, down = {
            2: (np.array([1.0, 0, 0]), np.array([0, 1.0, 0])),
            1: (np.array([1.0, 0, 0]), np.array([0, 0, -1.0])),
            0: (np.array([0, 1.0, 0]), np.array([0, 0, -1.0])),
        }[plane]
        transpose = abs(row_vec @ right) > abs(col_vec @ right)
        h_vec, v_vec = (row_vec, col_vec) if transpose else (col_vec, row_vec)
        _, nrow, ncol = volume.shape
        _, srow, scol = volume.spacing
        n_h, n_v = (nrow, ncol) if transpose else (ncol, nrow)
        s_h, s_v = (srow, scol) if transpose else (scol, srow)
        mm_per_pixel = max(n_h * s_h, n_v * s_v) / size
        return cls(
            transpose=bool(transpose),
            flip_h=bool(h_vec @ right < 0),
            flip_v=bool(v_vec @ down < 0),
            n_h=n_h,
            n_v=n_v,
            width=max(1, round(n_h * s_h / mm_per_pixel)),
            height=max(1, round(n_v * s_v / mm_per_pixel)),
            mm_per_pixel=mm_per_pixel,
            left=_letter(-right),
            top=_letter(-down),
        )

    def orient(self, image: np.ndarray) -> np.ndarray:
        """(row, column) slice -> (screen row, screen column) array, before resizing."""
        out = image.T if self.transpose else image
        if self.flip_h:
            out = out[:, ::-1]
        if self.flip_v:
            out = out[::-1, :]
        return np.ascontiguousarray(out)

    def to_display(self, row: float, col: float) -> tuple[float, float]:
        """Fractional (row, column) index -> (x, y) in display pixels."""
        h, v = (row, col) if self.transpose else (col, row)
        if self.flip_h:
            h = self.n_h - 1 - h
        if self.flip_v:
            v = self.n_v - 1 - v
        return ((h + 0.5) * self.width / self.n_h, (v + 0.5) * self.height / self.n_v)


def _letter(direction: np.ndarray) -> str:
    axis = int(np.argmax(np.abs(direction)))
    return _LETTERS[(axis, 1 if direction[axis] > 0 else -1)]


def window_for(finding: Finding | None) -> Window:
    """Lung window for lung findings, soft tissue otherwise."""
    if finding is None:
        return SOFT_TISSUE_WINDOW
    text = f"{finding.containing_organ or ''} {finding.label}".lower()
    return LUNG_WINDOW if "lung" in text else SOFT_TISSUE_WINDOW


def _grey(image: np.ndarray, window: Window | None) -> np.ndarray:
    """Windowed uint8 image; without a window (MR) the 1st-99th percentile is used."""
    image = image.astype(np.float32)
    if window is None:
        low, high = np.percentile(image, [1.0, 99.0])
    else:
        low, high = window.center - window.width / 2, window.center + window.width / 2
    scaled = (image - low) / max(float(high - low), 1e-6)
    return (np.clip(scaled, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


class _Canvas:
    """A display-resolution RGB image onto which slices, masks and text are drawn."""

    def __init__(self, transform: DisplayTransform, grey: np.ndarray) -> None:
        self.t = transform
        size = (transform.width, transform.height)
        base = Image.fromarray(transform.orient(grey)).resize(size, Image.Resampling.BILINEAR)
        self.rgb = np.repeat(np.asarray(base)[:, :, None], 3, axis=2).astype(np.float32)
        self.font = _font(max(12, transform.width // 40))

    def resize_mask(self, labels: np.ndarray) -> np.ndarray:
        size = (self.t.width, self.t.height)
        image = Image.fromarray(self.t.orient(labels.astype(np.int32)))
        return np.asarray(image.resize(size, Image.Resampling.NEAREST))

    def overlay(self, mask: np.ndarray, color: Color, alpha: float, outline: bool) -> None:
        """Blend ``color`` over ``mask`` and draw its outline, inside the mask's tight
        box, not over the whole image (an organ covers a small part of it): every pixel
        outside the box is outside the mask, as the erosion's border value says."""
        rows = np.flatnonzero(mask.any(axis=1))
        if rows.size == 0:
            return
        cols = np.flatnonzero(mask.any(axis=0))
        box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
        mask, rgb = mask[box], self.rgb[box]  # views: the writes land in self.rgb
        col = np.asarray(color, dtype=np.float32)
        if alpha > 0:
            rgb[mask] = (1 - alpha) * rgb[mask] + alpha * col
        if outline:
            edge = mask & ~ndimage.binary_erosion(mask, iterations=1, border_value=0)
            rgb[edge] = col

    def image(self) -> Image.Image:
        return Image.fromarray(np.clip(self.rgb + 0.5, 0, 255).astype(np.uint8), "RGB")


def _font(size: int) -> _Font:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType
        return ImageFont.load_default()


def _annotate(image: Image.Image, t: DisplayTransform, lines: Sequence[str], font: _Font) -> None:
    draw = ImageDraw.Draw(image)
    pad = max(4, t.width // 100)
    y = pad
    for text in lines:
        box = draw.textbbox((pad, y), text, font=font)
        draw.rectangle((box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2), fill=(0, 0, 0))
        draw.text((pad, y), text, fill=(255, 255, 255), font=font)
        y = box[3] + pad
    # orientation letters: left and top edges, mid-way
    box = draw.textbbox((0, 0), t.left, font=font)
    draw.text((pad, (t.height - box[3]) / 2), t.left, fill=(255, 255, 0), font=font)
    box = draw.textbbox((0, 0), t.top, font=font)
    draw.text(((t.width - box[2]) / 2, pad), t.top, fill=(255, 255, 0), font=font)
    # scale bar: 50 mm, or shorter when the field of view is small
    length_mm = next(
        (mm for mm in (50, 20, 10, 5, 2, 1) if mm / t.mm_per_pixel <= 0.4 * t.width), 1
    )
    length_px = length_mm / t.mm_per_pixel
    x1, y1 = t.width - pad, t.height - 2 * pad
    x0 = x1 - length_px
    draw.line((x0, y1, x1, y1), fill=(255, 255, 255), width=max(2, t.width // 200))
    for x in (x0, x1):
        draw.line((x, y1 - pad, x, y1), fill=(255, 255, 255), width=max(1, t.width // 300))
    text = f"{length_mm} mm"
    box = draw.textbbox((0, 0), text, font=font)
    draw.text((x1 - box[2], y1 - pad - box[3] - 2), text, fill=(255, 255, 255), font=font)


def _check_grid(ct: Volume, other: Volume, what: str) -> None:
    if not ct.same_geometry(other):
        raise ReportError(
            f"{what} geometry {other.shape} does not match the image {ct.shape}; "
            "key images need label maps on the input grid"
        )


def render_finding(
    ct: Volume,
    finding: Finding,
    finding_labels: Volume,
    *,
    axes: FindingAxes | None = None,
    organ_labels: Volume | None = None,
    organ_colors: Mapping[int, Color] | None = None,
    color: Color = (255, 0, 0),
    modality: str = "CT",
    size: int = 512,
    organ_sites: Mapping[str, CodedConcept] | None = None,
) -> Image.Image:
    """The key slice through ``finding`` with its overlay, RECIST axes and labels.

    ``finding_labels`` is the findings label map (value = finding id) on the CT grid.
    ``organ_sites``: organ label -> concept, to name the organ a finding lies in.
    """
    _check_grid(ct, finding_labels, "finding label map")
    z = finding.key_slice_index
    t = DisplayTransform.for_volume(ct, size)
    window = window_for(finding) if modality == "CT" else None
    canvas = _Canvas(t, _grey(ct.array[z], window))
    if organ_labels is not None and ct.same_geometry(organ_labels):
        organs = canvas.resize_mask(organ_labels.array[z])
        for value, organ_color in (organ_colors or {}).items():
            canvas.overlay(organs == value, organ_color, 0.0, outline=True)
    canvas.overlay(
        canvas.resize_mask(finding_labels.array[z]) == finding.label_value, color, 0.4, True
    )
    image = canvas.image()
    if axes is not None:
        draw = ImageDraw.Draw(image)
        width = max(1, t.width // 256)
        for (a, b), line_color in (
            (axes.long_axis, (255, 255, 0)),
            (axes.short_axis, (0, 255, 255)),
        ):
            draw.line((*t.to_display(*a), *t.to_display(*b)), fill=line_color, width=width)
    _annotate(image, t, finding_caption(finding, organ_sites or {}, z, ct.shape[0]), canvas.font)
    return image


def finding_caption(
    finding: Finding, organ_sites: Mapping[str, CodedConcept], z: int, slices: int
) -> list[str]:
    """The lines burnt into a finding's key image (and so into its Secondary Capture):
    the finding and its site by their concepts' names, as the SR and FHIR name them
    ("#12 Nodule in left lung"); before 2026-12-08 by the models' labels ("#12
    lung_nodule (lung_left)")."""
    return [
        f"#{finding.finding_id} {finding.concept.meaning}{site_text(finding, organ_sites)}",
        f"{finding.longest_diameter_mm:.1f} x {finding.short_axis_mm:.1f} mm, "
        f"{finding.volume_ml:.2f} ml",
        f"slice {z + 1}/{slices}",
    ]


def _overview_slice(organ_labels: Volume | None, finding_labels: Volume | None, n: int) -> int:
    for labels in (organ_labels, finding_labels):
        if labels is not None:
            # Slice by slice: count_nonzero without an axis counts in place, where with
            # one numpy first makes a boolean copy (10x the CPU on a 300-slice map).
            per_slice = np.array([np.count_nonzero(labels.array[z]) for z in range(n)], np.int64)
            if per_slice.any():
                return int(np.argmax(per_slice))
    return n // 2


def render_overview(
    ct: Volume,
    *,
    organ_labels: Volume | None = None,
    organ_colors: Mapping[int, Color] | None = None,
    finding_labels: Volume | None = None,
    finding_color: Color = (255, 0, 0),
    slice_index: int | None = None,
    modality: str = "CT",
    size: int = 512,
) -> tuple[Image.Image, int]:
    """A slice (default: the one with most organ voxels) with organ and finding overlays.
    A volume without a slice to draw is refused as a ReportError (an IndexError here
    failed a NIfTI of dim[3] = 0 as internal_error; ingest now refuses such a file)."""
    if 0 in ct.shape or (slice_index is not None and not 0 <= slice_index < ct.shape[0]):
        raise ReportError(
            f"no overview image can be drawn of a volume of shape {ct.shape}"
            + (f" at slice {slice_index}" if slice_index is not None else "")
        )
    for labels, what in ((organ_labels, "organ label map"), (finding_labels, "finding map")):
        if labels is not None:
            _check_grid(ct, labels, what)
    z = (
        slice_index
        if slice_index is not None
        else _overview_slice(organ_labels, finding_labels, ct.shape[0])
    )
    t = DisplayTransform.for_volume(ct, size)
    canvas = _Canvas(t, _grey(ct.array[z], SOFT_TISSUE_WINDOW if modality == "CT" else None))
    if organ_labels is not None:
        organs = canvas.resize_mask(organ_labels.array[z])
        for value, organ_color in (organ_colors or {}).items():
            canvas.overlay(organs == value, organ_color, 0.3, outline=True)
    if finding_labels is not None:
        canvas.overlay(canvas.resize_mask(finding_labels.array[z]) > 0, finding_color, 0.5, True)
    image = canvas.image()
    _annotate(image, t, [f"overview, slice {z + 1}/{ct.shape[0]}"], canvas.font)
    return image, z


def write_key_images(
    out_dir: Path,
    ct: Volume,
    findings: Sequence[Finding],
    finding_labels: Volume,
    *,
    axes: Sequence[FindingAxes] = (),
    organ_labels: Volume | None = None,
    organ_colors: Mapping[int, Color] | None = None,
    label_colors: Mapping[str, Color] | None = None,
    modality: str = "CT",
    size: int = 512,
    subdir: str = "keyimages",
    organ_sites: Mapping[str, CodedConcept] | None = None,
) -> list[KeyImageOutput]:
    """Write ``overview.png`` and ``finding-NNN.png`` under ``out_dir/subdir``.

    Returns the outputs for the report, with paths relative to ``out_dir``.
    ``label_colors`` maps a lesion label name to its overlay colour (manifest colour);
    ``organ_sites`` an organ label to its concept (the site a caption names).
    """
    folder = Path(out_dir) / subdir
    folder.mkdir(parents=True, exist_ok=True)
    by_id = {a.finding_id: a for a in axes}
    colors = label_colors or {}
    outputs: list[KeyImageOutput] = []
    image, z = render_overview(
        ct,
        organ_labels=organ_labels,
        organ_colors=organ_colors,
        finding_labels=finding_labels,
        modality=modality,
        size=size,
    )
    _save_png(image, folder / "overview.png")
    outputs.append(KeyImageOutput(path=f"{subdir}/overview.png", kind="overview", slice_index=z))
    for f in findings:
        checkpoint()  # a routine study's key images let URGENT work pass, image by image
        name = f"finding-{f.finding_id:03d}.png"
        finding_image = render_finding(
            ct,
            f,
            finding_labels,
            axes=by_id.get(f.finding_id),
            organ_labels=organ_labels,
            organ_colors=organ_colors,
            color=colors.get(f.label, (255, 0, 0)),
            modality=modality,
            size=size,
            organ_sites=organ_sites,
        )
        _save_png(finding_image, folder / name)
        outputs.append(
            KeyImageOutput(
                path=f"{subdir}/{name}",
                kind="finding",
                slice_index=f.key_slice_index,
                finding_id=f.finding_id,
            )
        )
    logger.info("key images written: %d", len(outputs))
    return outputs


def _save_png(image: Image.Image, path: Path) -> None:
    """Write ``image`` through :mod:`radserve.durable`: the console and WADO serve these
    files by name, so a crash mid-write must leave the old file or none, never a
    truncated PNG (inside the caller's :func:`radserve.durable.batch` the folder is
    fsynced once, with the job's other results)."""
    durable.write_with(
        path, lambda handle: image.save(handle, format="PNG", compress_level=PNG_LEVEL)
    )
