"""Print the label agreements tests/integration/test_nnunet_multichannel.py asserts.

The same cases (tests/factories/nnunet_cases.py: tiny folders, random weights, one
fold, TTA off): a CT + PET model and a one-channel MR ZScore model with
use_mask_for_norm, radserve vs ``nnUNetPredictor.predict_single_npy_array`` on the same
arrays.
Run from the repository root: ``PYTHONPATH=src:. python tools/nnunet_multichannel_agreement.py``
(needs the nnunet extra; about a minute on 2 idle cores).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from tests.factories.agreement import agreement, radserve_labels
from tests.factories.nnunet_cases import ct_pet_case, mr_case


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nnunet-mc-"))
    bundle, ct, pet, theirs, spacing = ct_pet_case(tmp / "petct")
    ours = radserve_labels(bundle, ct, spacing, {"pet": pet})
    print(f"CT + PET: agreement {agreement(ours, theirs):.5f}, classes {np.unique(theirs)}")
    bundle, mr, theirs, spacing = mr_case(tmp / "mr")
    ours = radserve_labels(bundle, mr, spacing)
    print(
        f"MR ZScore use_mask: agreement {agreement(ours, theirs):.5f}, classes {np.unique(theirs)}"
    )


if __name__ == "__main__":
    main()
