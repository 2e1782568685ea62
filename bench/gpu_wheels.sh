#!/usr/bin/env bash
# Download, on this machine, the cp312 wheels the GPU machine lacks (its image has python3.12,
# torch CUDA, numpy, scipy, scikit-learn, scikit-image, matplotlib, click, tqdm, pytest, but not
# these, and older grpcio/protobuf than constraints.txt pins) into .whl/ (git-ignored).
# Then carry .whl to the device and run bench/gpu_session.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -E "^$1==" constraints.txt | head -1; }
mkdir -p .whl
for name in opacus pytorch-msssim grpcio grpcio-health-checking grpcio-reflection protobuf \
            cryptography hypothesis pytest-timeout; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d .whl "$(pin "$name")"
done
# what they need that the image may lack (cffi for cryptography, sortedcontainers and attrs for
# hypothesis, opt-einsum for opacus)
for need in cffi pycparser sortedcontainers attrs opt-einsum; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl "$need"
done
ls -la .whl
du -sh .whl
