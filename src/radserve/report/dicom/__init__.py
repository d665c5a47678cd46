"""DICOM results in the source study: BINARY SEG and Comprehensive 3D SR (TID 1500).

``write_seg`` / ``write_sr`` write one object from file paths; ``build_seg`` /
``build_sr`` return the dataset from already-read source headers;
``write_dicom_results`` writes everything a report folder needs.
"""

from radserve.report.dicom.results import write_dicom_results
from radserve.report.dicom.seg import build_seg, write_seg
from radserve.report.dicom.sr import build_sr, write_sr

__all__ = ["build_seg", "build_sr", "write_dicom_results", "write_seg", "write_sr"]
