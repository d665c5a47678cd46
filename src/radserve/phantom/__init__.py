"""Synthetic CT phantoms with exact ground truth (organs, lesions) for tests and training.

See ``API.md`` in this folder for the contract the training code relies on.
"""

from radserve.phantom.dicom import write_dicom_series
from radserve.phantom.generate import Phantom, generate_phantom
from radserve.phantom.lesions import Lesion
from radserve.phantom.nifti import write_ground_truth, write_nifti
from radserve.phantom.spec import ORGAN_LABELS, ORGAN_NAMES, PhantomSpec

__all__ = [
    "ORGAN_LABELS",
    "ORGAN_NAMES",
    "Lesion",
    "Phantom",
    "PhantomSpec",
    "generate_phantom",
    "write_dicom_series",
    "write_ground_truth",
    "write_nifti",
]
