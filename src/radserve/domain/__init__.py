"""Pure data flowing between stages: no I/O, no imports from the rest of the package."""

from radserve.domain.accuracy import EvalSummary
from radserve.domain.findings import Classification, CodedConcept, Finding, OrganMeasurement
from radserve.domain.jobs import JobState
from radserve.domain.prediction import Prediction
from radserve.domain.priority import PriorityClass, PriorityRule, PriorityRules
from radserve.domain.volume import Volume

__all__ = [
    "Classification",
    "CodedConcept",
    "EvalSummary",
    "Finding",
    "JobState",
    "OrganMeasurement",
    "Prediction",
    "PriorityClass",
    "PriorityRule",
    "PriorityRules",
    "Volume",
]
