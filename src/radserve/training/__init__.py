"""Train, export and bundle the reference models on synthetic phantoms.

PyTorch is an optional extra (``pip install radserve[train]``): importing this package
does not import torch; only :mod:`radserve.training.net`, ``train`` and ``export`` do,
and they are imported lazily by ``python -m radserve.training``.
"""
