#!/usr/bin/env bash
# Here (CPU): the prompts stage of the 18-language draft, made with the paths it has on the GPU machine
# (language ID runs here, so the GPU machine needs neither fastText nor lingua), and what the device calls carry.
#
#   bash ../shared/device/prepare.sh          # .device/whl (speculators' wheels), .device/m1, .device/m2 (verifier GGUF)
#   bash scripts/multilingual_prep.sh         # .device/p37/run.txz (prompt files + the run), .device/whl2 (CLI wheels)
#   then the device calls of scripts/multilingual_device.sh
#
# Every language of the data pack (shared/data/train and train/more, en_sharegpt left out), English kept at 35 %
# of the training prompts and the 17 others sharing the rest equally; each language holds out its own split.
set -eu
cd "$(dirname "$0")/.."
DATA=${POLYSPEC_DATA:-../shared/data}
P=/tmp/p37
RUN=${RUN:-multi18}
LANGS=en,fr,de,es,it,ru,zh,ja,ko,ar,hi,th,pt,id,nl,pl,tr,vi
rm -rf $P && mkdir -p $P/train $P/more .device/p37 .device/whl2
for f in "$DATA"/train/*.jsonl; do [ "$(basename "$f")" = en_sharegpt.jsonl ] || cp "$f" $P/train/; done
for f in "$DATA"/train/more/*.jsonl.gz; do zcat "$f" > "$P/more/$(basename "$f" .gz)"; done
MIX=$(python3 -c "
langs = '$LANGS'.split(','); rest = [l for l in langs if l != 'en']
w = {l: round(0.65 / len(rest), 6) for l in rest}; w['en'] = round(1 - sum(w.values()), 6)
print(','.join(f'{l}={w[l]}' for l in langs))")
cat > $P/plan.json <<'EOF'
{"answers": {"max_prompt_tokens": 1024},
 "hidden": {"batch_size": 64, "max_batch_tokens": 65536},
 "eval": {"heldout_max_prompts": 40, "evaluate_parent": false}}
EOF
ln -sfn "$(.venv/bin/python -c 'from polyspec.models.verifiers import resolve_verifier as r; print(r("smollm2-135m-instruct").path)')" /tmp/v
rm -rf /tmp/pshome/runs/$RUN
# shellcheck disable=SC2046  # one --prompts per file
POLYSPEC_HOME=/tmp/pshome .venv/bin/python -m polyspec.cli train run --languages $LANGS --mix "$MIX" \
  $(for f in $P/train/*.jsonl $P/more/*.jsonl; do echo --prompts "$f"; done) --config $P/plan.json \
  --run-id $RUN --verifier /tmp/v --max-prompts 9000 --coverage-target 0.95 --draft-vocab-size 12288 \
  --max-new-tokens 256 --answer-batch-size 1024 --layers 1 --epochs 4 --lr 5e-4 --warmup-steps 60 \
  --eval-turns 1,2 --eval-max-new-tokens 256 --no-register --until prompts
(cd /tmp && tar cJf "$OLDPWD/.device/p37/run.txz" p37 pshome/runs/$RUN)
# the CLI's imports that the GPU machine lacks (pins from requirements.lock), for its Python 3.12
.venv/bin/pip download -q --python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .device/whl2 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_28_x86_64 $(grep -i -E '^(annotated-doc|click|markdown-it-py|mdurl|pygments|rich|shellingham|sqlalchemy|typer|greenlet|pyyaml)==' requirements.lock)
du -sh .device/p37 .device/whl2
