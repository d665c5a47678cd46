#!/usr/bin/env bash
# Here, before a leased-GPU session's first call: what tools/device/gpu_*.sh need carried.
# .gpu1 ... .gpu6: onnxruntime-gpu's installed files as an xz'd tar in 40 MB parts (one
# part per call: the wheel is 255 MB, a call carries 64 MiB with the tree) and its sha256;
# .whl: radserve's dependencies that the device image (Python 3.12, PyTorch with CUDA 13)
# lacks, and MONAI for the baseline. xz -9e takes ~3 CPU-minutes. Then, one call each:
#   run(command="mkdir -p /root/parts && cp .gpuK/* /root/parts/", carry=[".gpuK"])  K=1..5
#   run(command="bash tools/device/gpu_check.sh", carry=[".gpu6", ".whl"])
# With NNUNET=1 also .gpu7 (nnU-Net's wheels and SimpleITK), with RAY=1 .gpu8 and .gpu9
# (Ray's wheel), copied the same way before the last call; gpu_install.sh installs what
# it finds in /root/parts.
# back to back: the parts stay only while the machine is warm (30 s after each call).
set -euo pipefail
ORT=${ORT:-onnxruntime-gpu==1.31.1}
WORK=$(mktemp -d)
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS "$@"; }
get -d "$WORK" "$ORT"
(cd "$WORK" && unzip -q onnxruntime_gpu-*.whl && tar -cf - onnxruntime onnxruntime_gpu-*.dist-info | xz -9e -T2 > ort.tar.xz)
for i in 1 2 3 4 5 6; do rm -rf ".gpu$i"; mkdir ".gpu$i"; grep -qx "/.gpu$i/" .git/info/exclude || echo "/.gpu$i/" >> .git/info/exclude; done
(cd "$WORK" && split -b 40000000 -d -a 1 ort.tar.xz ort.tar.xz.)
i=1; for part in "$WORK"/ort.tar.xz.?; do mv "$part" ".gpu$i/"; i=$((i + 1)); done
sha256sum "$WORK/ort.tar.xz" | cut -d' ' -f1 > .gpu6/ort.sha256
rm -rf .whl && mkdir .whl && (grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude)
# fastapi >= 0.16x needs opentelemetry-api (not on the image: serve did not start without it)
get -d .whl pydicom pylibjpeg pylibjpeg-openjpeg pylibjpeg-rle pyjpegls highdicom pynetdicom nibabel \
  connected-components-3d pydantic pydantic-core annotated-types typing-inspection annotated-doc \
  sqlalchemy greenlet alembic mako pydantic-settings python-dotenv "fhir.resources>=8,<9" fhir-core \
  fastapi starlette opentelemetry-api importlib-metadata uvicorn httptools python-multipart simpy "monai==1.6.1"
# NNUNET=1: nnU-Net's predictor for `bench --scenario nnunet` (gpu_platform_check.sh):
# nnunetv2 and three of its packages are sdists (built here as pure-Python wheels); its
# SimpleITK (52 MB as a wheel) travels as an xz'd tar in .gpu7, one call of its own
# (with these wheels: .whl beside .gpu6 and the tree is at the 64 MiB limit)
if [ "${NNUNET:-0}" = 1 ]; then
  rm -rf .gpu7 && mkdir .gpu7 && (grep -qx "/.gpu7/" .git/info/exclude || echo "/.gpu7/" >> .git/info/exclude)
  get -d .gpu7 SimpleITK "blosc2>=3.3.2" ndindex batchgenerators graphviz yacs
  python3 -m pip wheel -q --no-deps -w .gpu7 "nnunetv2==2.8.1" "dynamic-network-architectures==0.4.4" \
    "acvl_utils==0.2.6" "batchgeneratorsv2==0.3.6"
  mkdir "$WORK/sitk" && (cd "$WORK/sitk" && unzip -q "$OLDPWD"/.gpu7/simpleitk-*.whl)
  rm .gpu7/simpleitk-*.whl
  tar -C "$WORK/sitk" -cf - . | xz -9e -T2 > .gpu7/sitk.tar.xz
fi
# RAY=1: Ray for gpu_ray_check.sh: its 79 MB wheel split in two (.gpu8, .gpu9, one call
# each), the packages it needs that the image lacks in .whl
if [ "${RAY:-0}" = 1 ]; then
  RAY_VERSION=${RAY_VERSION:-2.60.0}
  get -d "$WORK" "ray==$RAY_VERSION"
  get -d .whl jsonschema jsonschema-specifications referencing rpds-py
  for i in 8 9; do rm -rf ".gpu$i"; mkdir ".gpu$i"; grep -qx "/.gpu$i/" .git/info/exclude || echo "/.gpu$i/" >> .git/info/exclude; done
  wheel=$(basename "$WORK"/ray-*.whl)
  (cd "$WORK" && split -b 40000000 -d -a 1 "$wheel" "$wheel.")
  mv "$WORK/$wheel.0" .gpu8/ && mv "$WORK/$wheel.1" .gpu9/
fi
rm -rf "$WORK"
du -sh .gpu? .whl
