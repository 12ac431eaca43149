#!/usr/bin/env bash
# Device call 1 of a GPU run of the product CLI (scripts/multilingual_device.sh prep, scripts/multigpu_device.sh),
# carrying .device/m1 and .device/whl (bash ../shared/device/prepare.sh fills them here):
#
#   bash scripts/device_prep.sh
#
# On the GPU machine: speculators and the wheels it needs into /tmp/site, the first half of the verifier GGUF
# into /tmp/m (the next call brings the second), and the package staged as installed in /tmp/pkg: polyspec/ plus
# core/ models/ ... mapped to polyspec.* (pyproject's package-dir), as symlinks into this checkout. Then it prints
# the torch and transformers versions and the GPU's name, and fails if any of them does not import.
set -u
export PYTHONPATH=/tmp/site:/tmp/pkg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p /tmp/m && cp .device/m1/part00 /tmp/m/ || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl || exit 1
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/polyspec
for f in polyspec/*.py; do ln -s "$PWD/$f" /tmp/pkg/polyspec/; done
for d in core models registry router training; do ln -s "$PWD/$d" "/tmp/pkg/polyspec/$d"; done
python3 -c "import torch, transformers, speculators; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
