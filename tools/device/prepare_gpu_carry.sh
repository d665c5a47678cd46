#!/usr/bin/env bash
# Here, before a leased-GPU session's first call: what tools/device/gpu_*.sh need carried.
# .gpu1 ... .gpu6: onnxruntime-gpu's installed files as an xz'd tar in 40 MB parts (one
# part per call: the wheel is 255 MB, a call carries 64 MiB with the tree) and its sha256;
# .whl: radserve's dependencies that the device image (Python 3.12, PyTorch with CUDA 13)
# lacks, and MONAI for the baseline. xz -9e takes ~3 CPU-minutes. Then, one call each:
#   run(command="mkdir -p /root/parts && cp .gpuK/* /root/parts/", carry=[".gpuK"])  K=1..5
#   run(command="bash tools/device/gpu_check.sh", carry=[".gpu6", ".whl"])
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
  fastapi starlette opentelemetry-api importlib-metadata uvicorn python-multipart simpy "monai==1.6.1"
rm -rf "$WORK"
du -sh .gpu? .whl
