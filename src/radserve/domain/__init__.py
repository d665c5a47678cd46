"""Pure data flowing between stages: no I/O, no imports from the rest of the package."""

from radserve.domain.findings import CodedConcept, Finding, OrganMeasurement
from radserve.domain.prediction import Prediction
from radserve.domain.volume import Volume

__all__ = ["CodedConcept", "Finding", "OrganMeasurement", "Prediction", "Volume"]
