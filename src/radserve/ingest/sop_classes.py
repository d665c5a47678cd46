"""The image storage SOP classes radserve's pipelines read as a volume.

One list for the gateway (the first part of what the SCP accepts,
``radserve.gateway.conformance.IMAGE_STORAGE``) and for series selection
(``radserve.pipeline.selection``): a series of any other class (Secondary Capture such
as a scanner's dose report, NM, projection X-ray, ultrasound) travels with a study but is
never the series a pipeline runs on.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydicom.uid import (
    UID,
    CTImageStorage,
    EnhancedCTImageStorage,
    EnhancedMRImageStorage,
    EnhancedPETImageStorage,
    LegacyConvertedEnhancedCTImageStorage,
    LegacyConvertedEnhancedMRImageStorage,
    LegacyConvertedEnhancedPETImageStorage,
    MRImageStorage,
    PositronEmissionTomographyImageStorage,
)

# Grey-scale cross-sectional images, single- and multi-frame (Enhanced MR Color is
# accepted by the gateway but not here: ingest refuses colour pixels), and the Modality
# each class's IOD requires (PS3.3 C.8.2.1, C.8.3.1, C.8.9.1 and the Enhanced modules).
VOLUME_MODALITY: dict[UID, str] = {
    CTImageStorage: "CT",
    EnhancedCTImageStorage: "CT",
    LegacyConvertedEnhancedCTImageStorage: "CT",
    MRImageStorage: "MR",
    EnhancedMRImageStorage: "MR",
    LegacyConvertedEnhancedMRImageStorage: "MR",
    PositronEmissionTomographyImageStorage: "PT",
    EnhancedPETImageStorage: "PT",
    LegacyConvertedEnhancedPETImageStorage: "PT",
}
VOLUME_IMAGE_STORAGE: tuple[UID, ...] = tuple(VOLUME_MODALITY)

# An Image Type value that makes an image a scout: never a pipeline's input, whatever a
# pipeline's exclude_image_types say.
LOCALIZER_IMAGE_TYPE = "LOCALIZER"


def is_localizer(image_type: Iterable[object]) -> bool:
    """Whether an Image Type (or an Enhanced frame's Frame Type) names a localizer, in
    any of its values and any case: the one check for ingest's frames, series selection,
    channel matching and the gateway's late instances."""
    return LOCALIZER_IMAGE_TYPE in {str(v).strip().upper() for v in image_type}


__all__ = [
    "LOCALIZER_IMAGE_TYPE",
    "VOLUME_IMAGE_STORAGE",
    "VOLUME_MODALITY",
    "is_localizer",
]
