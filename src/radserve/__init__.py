"""radserve: on-premise radiology AI inference."""

__version__ = "0.1.0"

from radserve.pydicom_plugins import defer_gdcm as _defer_gdcm

_defer_gdcm()  # before anything imports pydicom: GDCM is loaded when a study needs it
