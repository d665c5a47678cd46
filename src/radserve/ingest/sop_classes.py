"""The image storage SOP classes radserve's pipelines read as a volume.

One list for the gateway (the first part of what the SCP accepts,
``radserve.gateway.conformance.IMAGE_STORAGE``) and for series selection
(``radserve.pipeline.selection``): a series of any other class (Secondary Capture such
as a scanner's dose report, NM, projection X-ray, ultrasound) travels with a study but is
never the series a pipeline runs on.
"""

from __future__ import annotations

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
# accepted by the gateway but not here: ingest refuses colour pixels).
VOLUME_IMAGE_STORAGE: tuple[UID, ...] = (
    CTImageStorage,
    EnhancedCTImageStorage,
    LegacyConvertedEnhancedCTImageStorage,
    MRImageStorage,
    EnhancedMRImageStorage,
    LegacyConvertedEnhancedMRImageStorage,
    PositronEmissionTomographyImageStorage,
    EnhancedPETImageStorage,
    LegacyConvertedEnhancedPETImageStorage,
)

__all__ = ["VOLUME_IMAGE_STORAGE"]
