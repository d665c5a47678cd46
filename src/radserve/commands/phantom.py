"""``radserve phantom``: write a synthetic CT study (DICOM series + ground truth)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import click

from radserve.commands._outputs import refuse_unusable, staged
from radserve.commands.params import SEED, FiniteFloatRange
from radserve.config import IngestSettings

logger = logging.getLogger(__name__)


@click.command("phantom")
@click.option("--seed", type=SEED, required=True, help="Phantom seed.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Output folder, new or empty (created): dicom/, ground_truth/, and ct.nii.gz with "
    "--nifti.",
)
@click.option("--small", is_flag=True, help="Small fast phantom (128x128, 40-60 slices).")
@click.option(
    "--transfer-syntax",
    type=click.Choice(["explicit", "jpeg2000", "rle"]),
    default="explicit",
    show_default=True,
    help="Explicit VR Little Endian, JPEG 2000 lossless or RLE lossless.",
)
@click.option("--nifti", is_flag=True, help="Also write the CT as ct.nii.gz.")
@click.option("--slices", type=click.IntRange(min=1), help="Number of slices (same patient).")
@click.option("--slice-spacing", type=FiniteFloatRange(min=0.1), help="Slice spacing in mm.")
@click.option("--lesions", type=click.IntRange(0, 100), help="Number of lesions to draw.")
@click.option(
    "--priority",
    type=click.Choice(["STAT", "HIGH", "ROUTINE", "MEDIUM", "LOW"], case_sensitive=False),
    default="ROUTINE",
    show_default=True,
    help="Requested Procedure Priority written to the study.",
)
@click.option("--patient-name", help="Patient's Name (DICOM PN, e.g. 'Doe^Jane').")
@click.option("--patient-id", help="Patient ID.")
@click.option("--study-uid", help="Study Instance UID (default: derived from the seed).")
@click.option(
    "--pet",
    is_flag=True,
    help=(
        "Also write a PET series (PT*.dcm in DIR/dicom: same patient, study and Frame of "
        "Reference, hot lesions of known SUV) and its truth (ground_truth/suv.nii.gz, pet.json)."
    ),
)
@click.option(
    "--mr",
    is_flag=True,
    help=(
        "Also write T1-, T2- and FLAIR-like MR series of the same anatomy (MR-<sequence>-*.dcm "
        "in DIR/dicom: same patient, study, Frame of Reference and grid as the CT)."
    ),
)
@click.option(
    "--mr-grids",
    is_flag=True,
    help=(
        "With --mr: each sequence on its own grid in the CT's Frame of Reference (T1 3D 3.0 mm "
        "isotropic; T2 1.6 mm pixels, 6 mm slices, smaller field of view; FLAIR 2 mm pixels, "
        "5 mm slices with a 1 mm gap, tilted 15 degrees; radserve.phantom.mr_grids)."
    ),
)
@click.option(
    "--mr-second-frame",
    type=click.Choice(["T1", "T2", "FLAIR"]),
    help="With --mr: write this sequence in a second Frame of Reference (not registered).",
)
def command(
    seed: int,
    out_dir: Path,
    small: bool,
    transfer_syntax: str,
    nifti: bool,
    slices: int | None,
    slice_spacing: float | None,
    lesions: int | None,
    priority: str,
    patient_name: str | None,
    patient_id: str | None,
    study_uid: str | None,
    pet: bool,
    mr: bool,
    mr_grids: bool,
    mr_second_frame: str | None,
) -> None:
    """Generate a synthetic chest/abdomen CT with exact organ and lesion ground truth."""
    from radserve.phantom import (
        PhantomSpec,
        generate_phantom,
        write_dicom_series,
        write_ground_truth,
        write_nifti,
    )

    if (mr_grids or mr_second_frame) and not mr:
        # before anything is written: checked after the CT, it left a whole study behind
        raise click.UsageError("--mr-grids and --mr-second-frame need --mr")
    # a file in the way, or an earlier phantom's slices (a series of two phantoms beside
    # the ground truth of one): one line, exit 2, before anything is generated
    refuse_unusable(out_dir, "--out")
    spec = PhantomSpec.random(seed, small=small)
    if slices is not None or slice_spacing is not None:
        spec = spec.with_slices(slices, slice_spacing)
    voxels = spec.n_slices * spec.rows * spec.columns
    if voxels > IngestSettings().max_voxels:  # before: a MemoryError traceback (1e8 slices)
        raise click.BadParameter(
            f"{spec.n_slices} slices of {spec.rows}x{spec.columns} are {voxels:,} voxels, over "
            f"what radserve ingests by default ({IngestSettings().max_voxels:,}, "
            "ingest.max_voxels)",
            param_hint="'--slices'",
        )
    if lesions is not None:
        spec = dataclasses.replace(spec, n_lesions=lesions)
    phantom = generate_phantom(spec)
    # written whole or not at all (Ctrl-C mid-series left a study without ground truth)
    with staged(out_dir, "--out", last=("dicom",)) as staging:
        write_dicom_series(
            phantom,
            staging / "dicom",
            transfer_syntax=transfer_syntax,  # type: ignore[arg-type]
            patient_name=patient_name,
            patient_id=patient_id,
            priority=priority.upper(),
            study_uid=study_uid,
        )
        write_ground_truth(phantom, staging / "ground_truth")
        if pet:
            from radserve.phantom.pet import generate_pet, write_pet_ground_truth, write_pet_series

            pet_phantom = generate_pet(phantom)
            write_pet_series(
                pet_phantom,
                staging / "dicom",
                patient_name=patient_name,
                patient_id=patient_id,
                study_uid=study_uid,
            )
            write_pet_ground_truth(pet_phantom, staging / "ground_truth")
        if mr:
            from radserve.phantom.mr import SEQUENCES, write_mr_series
            from radserve.phantom.mr_grids import VARIED_GRIDS, second_frame_of_reference

            for sequence in SEQUENCES:
                second = sequence == mr_second_frame
                write_mr_series(
                    phantom,
                    staging / "dicom",
                    sequence,
                    patient_name=patient_name,
                    patient_id=patient_id,
                    study_uid=study_uid,
                    grid=VARIED_GRIDS[sequence] if mr_grids else None,
                    frame_of_reference_uid=second_frame_of_reference(spec.seed) if second else None,
                )
        if nifti:
            write_nifti(phantom.ct, staging / "ct.nii.gz")
    logger.info(
        "phantom seed %d: %d slices, %d lesions", seed, spec.n_slices, len(phantom.lesion_list)
    )
    click.echo(str(out_dir))
