"""nnU-Net folders for tests: the benchmark's own factory (one definition)."""

from radserve.bench.nnunet_model import (
    CONFIG,
    FOLDER,
    default_ct_plans,
    make_results_folder,
    tiny_dataset,
    tiny_plans,
)

__all__ = [
    "CONFIG",
    "FOLDER",
    "default_ct_plans",
    "make_results_folder",
    "tiny_dataset",
    "tiny_plans",
]
