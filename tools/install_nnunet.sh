#!/usr/bin/env bash
# Install the `nnunet` extra's packages without letting pip swap the CPU torch.
#
# Why not `pip install -e ".[nnunet]"`: dynamic-network-architectures >= 0.4 requires timm,
# which requires torchvision; PyPI's torchvision wants another torch (a several-GB CUDA
# build) and fails to import beside the CPU torch 2.13.0 this machine has on disk. timm is
# used only by DNA's transformer architectures (Primus, EVA), never by the U-Nets that
# nnU-Net's default plans build, so nnunetv2, dynamic-network-architectures, acvl_utils
# and batchgeneratorsv2 go in without their dependencies, and every other dependency
# they declare goes in normally (none of those pulls torch).
# Usage: tools/install_nnunet.sh [path/to/python]   (default: .venv/bin/python)
set -euo pipefail
PY="${1:-.venv/bin/python}"
"$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet tqdm batchgenerators scikit-learn "scikit-image>=0.19.3" \
  "SimpleITK>=2.2.1" pandas graphviz tifffile requests matplotlib seaborn imagecodecs yacs \
  einops "blosc2>=3.3.2" "torch==2.13.0"
"$PY" -m pip install --quiet --no-deps "nnunetv2==2.8.1" "dynamic-network-architectures==0.4.4" \
  "acvl_utils==0.2.6" "batchgeneratorsv2==0.3.6"
"$PY" -c "import torch, nnunetv2, dynamic_network_architectures; print('nnunet extra: torch', torch.__version__)"
