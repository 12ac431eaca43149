#!/usr/bin/env bash
# Here (CPU): what scripts/multigpu_device.sh needs, in .device/ (git-ignored).
# The run's prompts stage (language ID runs here, so the GPU machine needs neither fastText nor lingua), made
# with the paths it will have there: /tmp/p18 (prompts, base draft), /tmp/v (verifier), /tmp/pshome (runs).
set -eu
cd "$(dirname "$0")/.."
DATA=${POLYSPEC_DATA:-../shared/data}
mkdir -p /tmp/p18 .device/p18/whl .device/en
cp "$DATA/train/fr.jsonl" "$DATA/train/en.jsonl" /tmp/p18/
ln -sfn "$PWD/models/drafts/smollm2-135m-instruct-en" /tmp/p18/en
ln -sfn "$(.venv/bin/python -c 'from polyspec.models.verifiers import resolve_verifier as r; print(r("smollm2-135m-instruct").path)')" /tmp/v
SEEDS=${1:-0 1}  # two seeds: the noise that a 2- or 4-GPU run's acceptance is judged against
for seed in $SEEDS; do
  rm -rf /tmp/pshome/runs/fr-g1-s$seed
  POLYSPEC_HOME=/tmp/pshome .venv/bin/python -m polyspec.cli train run fr --run-id fr-g1-s$seed --until prompts \
    --prompts /tmp/p18/fr.jsonl --replay /tmp/p18/en.jsonl:1.0 --from /tmp/p18/en --verifier /tmp/v \
    --max-prompts 1024 --max-new-tokens 128 --answer-batch-size 256 --epochs 3 --lr 3e-4 --warmup-steps 10 \
    --eval-max-questions 40 --eval-max-new-tokens 128 --eval-languages fr,en --no-register --seed "$seed" | tail -n 3
done
(cd /tmp && tar czf "$OLDPWD/.device/p18/run.tgz" p18/fr.jsonl p18/en.jsonl $(for s in $SEEDS; do echo pshome/runs/fr-g1-s$s; done))
cp models/drafts/smollm2-135m-instruct-en/* .device/en/
# the CLI's imports that the GPU machine lacks (pins from requirements.lock), for its Python 3.12
.venv/bin/pip download -q --python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .device/p18/whl \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_28_x86_64 $(grep -i -E '^(annotated-doc|click|markdown-it-py|mdurl|pygments|rich|shellingham|sqlalchemy|typer|greenlet|pyyaml)==' requirements.lock)
du -sh .device/p18 .device/en
