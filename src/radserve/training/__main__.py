"""``python -m radserve.training`` (needs the ``[train]`` extra: PyTorch)."""

import sys

from radserve.training.cli import main

sys.exit(main())
