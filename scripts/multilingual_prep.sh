#!/usr/bin/env bash
# Here (CPU): the prompts stage of the 18-language draft, made with the paths it has on the GPU machine
# (language ID runs here, so the GPU machine needs neither fastText nor lingua), and what the device calls carry.
#
#   bash ../shared/device/prepare.sh          # .device/whl (speculators' wheels), .device/m1, .device/m2 (verifier GGUF)
#   bash scripts/multilingual_prep.sh         # .device/PACK/run.txz (prompt files + the run), .device/whl2,
#                                             #   .device/whl3 (CLI wheels)
#   then the device calls of scripts/multilingual_device.sh
#
# Every language of the data pack (shared/data/train and train/more), English kept at EN_SHARE of the training
# prompts and the 17 others sharing the rest equally; each language holds out its own split. The recipe comes from
# the environment (defaults: the first run, multi18):
#   RUN (multi18), PACK (p37: /tmp/PACK here and there, .device/PACK), EN_SHARE (0.35), MAX_PROMPTS (9000),
#   EPOCHS (4), LR (5e-4), HELDOUT_EVAL (40: held-out prompts evaluated per language), SHAREGPT (0: en_sharegpt
#   left out; 1: kept), FROM (a parent draft directory: copied into the pack as PACK/parent, a warm start whose
#   vocabulary grows to 12,288 tokens)
# The second run, warm-started from the English base:
#   RUN=multi18b PACK=p38 EN_SHARE=0.35 MAX_PROMPTS=14000 EPOCHS=3 LR=3e-4 HELDOUT_EVAL=24 SHAREGPT=1 \
#     FROM=models/drafts/smollm2-135m-instruct-en bash scripts/multilingual_prep.sh
set -eu
cd "$(dirname "$0")/.."
DATA=${POLYSPEC_DATA:-../shared/data}
RUN=${RUN:-multi18}
PACK=${PACK:-p37}
P=/tmp/$PACK
LANGS=en,fr,de,es,it,ru,zh,ja,ko,ar,hi,th,pt,id,nl,pl,tr,vi
rm -rf $P .device/$PACK && mkdir -p $P/train $P/more .device/$PACK .device/whl2 .device/whl3
for f in "$DATA"/train/*.jsonl; do
  if [ "$(basename "$f")" != en_sharegpt.jsonl ] || [ "${SHAREGPT:-0}" = 1 ]; then cp "$f" $P/train/; fi
done
FROM_ARGS=()
if [ -n "${FROM:-}" ]; then cp -r "$FROM" $P/parent && FROM_ARGS=(--from $P/parent); fi
for f in "$DATA"/train/more/*.jsonl.gz; do zcat "$f" > "$P/more/$(basename "$f" .gz)"; done
MIX=$(python3 -c "
langs = '$LANGS'.split(','); rest = [l for l in langs if l != 'en']
w = {l: round((1 - ${EN_SHARE:-0.35}) / len(rest), 6) for l in rest}; w['en'] = round(1 - sum(w.values()), 6)
print(','.join(f'{l}={w[l]}' for l in langs))")
cat > $P/plan.json <<EOF
{"answers": {"max_prompt_tokens": 1024},
 "hidden": {"batch_size": 64, "max_batch_tokens": 65536},
 "eval": {"heldout_max_prompts": ${HELDOUT_EVAL:-40}, "evaluate_parent": false}}
EOF
ln -sfn "$(.venv/bin/python -c 'from polyspec.models.verifiers import resolve_verifier as r; print(r("smollm2-135m-instruct").path)')" /tmp/v
rm -rf /tmp/pshome/runs/$RUN
# shellcheck disable=SC2046  # one --prompts per file
POLYSPEC_HOME=/tmp/pshome .venv/bin/python -m polyspec.cli train run --languages $LANGS --mix "$MIX" \
  $(for f in $P/train/*.jsonl $P/more/*.jsonl; do echo --prompts "$f"; done) --config $P/plan.json \
  --run-id $RUN --verifier /tmp/v --max-prompts "${MAX_PROMPTS:-9000}" --coverage-target 0.95 \
  --draft-vocab-size 12288 --max-new-tokens 256 --answer-batch-size 1024 --layers 1 --epochs "${EPOCHS:-4}" \
  --lr "${LR:-5e-4}" --warmup-steps 60 --eval-turns 1,2 --eval-max-new-tokens 256 --no-register --until prompts \
  "${FROM_ARGS[@]}"
(cd /tmp && tar cJf "$OLDPWD/.device/$PACK/run.txz" $PACK pshome/runs/$RUN)
# the CLI's imports that the GPU machine lacks (pins from requirements.lock), for its Python 3.12
.venv/bin/pip download -q --python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .device/whl2 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_28_x86_64 $(grep -i -E '^(annotated-doc|click|markdown-it-py|mdurl|pygments|rich|shellingham|sqlalchemy|typer|greenlet|pyyaml)==' requirements.lock)
# and those that do not fit beside the verifier in call 2 (the registry's migrations, language codes): call 3's
# shellcheck disable=SC2046
.venv/bin/pip download -q --python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .device/whl3 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  $(grep -i -E '^(alembic|mako|markupsafe|pycountry)==' requirements.lock)
du -sh .device/$PACK .device/whl2 .device/whl3
