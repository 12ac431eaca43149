#!/usr/bin/env bash
# The 18-language draft on the GPU machine: `polyspec train run --run-id multi18 --resume --gpus 1` (torchrun, NCCL,
# bf16) on the run whose prompts stage scripts/multilingual_prep.sh made here. Calls of at most 10 minutes:
#
#   bash scripts/multilingual_device.sh prep     # call 1 (carry .device/m1 .device/whl): wheels, the package
#                                                #   (scripts/device_prep.sh)
#   bash scripts/multilingual_device.sh verifier # call 2 (carry .device/m2 .device/whl2): CLI wheels, the verifier
#   bash scripts/multilingual_device.sh go WAIT  # call 3 (carry .device/PACK .device/whl3): the rest of the CLI's
#                                                #   wheels, the run in the background; waits WAIT s
#   bash scripts/multilingual_device.sh wait WAIT  # later calls: wait, then bring back what is new
#   UNSEEN="NAME=DIR ..." with go: once the fit is done, `polyspec eval` of the new draft and each DIR (carried
#   here, e.g. shipped drafts) on every bench/data/unseen/LANG.jsonl, beside the run's own evaluation; its
#   figures come back in run-files.tgz (unseen/results.json). By hand: ... multilingual_device.sh unseen NAME=DIR...
#
# RUN and PACK (defaults multi18, p37) name the run and the pack that scripts/multilingual_prep.sh made.
#
# A device call from a checkout with the shipped drafts is over the 64 MiB that travels: untrack them for the
# calls (`git rm -q -r --cached models/drafts` plus `/models/drafts/` in .git/info/exclude; afterwards
# `git reset -q -- models/drafts` and drop the exclude line). Back under $OUT (8 files at most): the run's --json
# output (run.json, whose "summary" has the seconds per stage, coverage and acceptance), the log, the evaluation
# (results.json), the run's small JSON files, and the draft (config, weights in two parts, sha256).
set -u
cmd=${1:-wait}
export PYTHONPATH=/tmp/site:/tmp/pkg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 POLYSPEC_HOME=/tmp/pshome
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
RUN=${RUN:-multi18}
PACK=${PACK:-p37}
R=/tmp/r37
start=$(date +%s)

collect() {
  local d=/tmp/pshome/runs/$RUN
  cp $R/run.json "$OUT/" 2>/dev/null  # progress.txt: printed below
  [ -f $R/run.log ] && grep -v -E '━|Loading weights' $R/run.log | tail -c 200000 > "$OUT/run.log"
  [ -f $d/evaluate/results.json ] && cp $d/evaluate/results.json "$OUT/"
  (cd $d 2>/dev/null && find . -name '*.json' -size -4M -not -path './evaluate/*' -not -path '*/checkpoints/*' \
    -not -path './hidden-states/*' > /tmp/run-files.txt && tar -czf "$OUT/run-files.tgz" -T /tmp/run-files.txt \
    $([ -d /tmp/unseen ] && echo "-C /tmp unseen"))  # the unseen-language evaluation, when there is one
  if [ -f $d/fit/draft/model.safetensors ]; then
    cp $d/fit/draft/config.json "$OUT/draft-config.json"
    split -b 15M -d -a 1 $d/fit/draft/model.safetensors "$OUT/draft.part"
    (cd $d/fit/draft && sha256sum model.safetensors) > "$OUT/draft.sha256"
  fi
  cat $R/progress.txt 2>/dev/null
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
}

wait_done() {
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - start )) -lt "$1" ]; do sleep 5; done
  grep -v -E '━|Loading weights|Warning|warn' $R/run.log 2>/dev/null | tail -n 30 | cut -c1-200
}

case "$cmd" in
prep) bash scripts/device_prep.sh ;;  # the wheels, the first half of the verifier, /tmp/pkg
verifier)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl2/*.whl || exit 1
  cp .device/m2/part01 /tmp/m/ && cat /tmp/m/part00 /tmp/m/part01 > /tmp/m/smollm2.gguf || exit 1
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/m/smollm2.gguf" | sha256sum -c - || exit 1
  (cd /tmp && python3 -c "from pathlib import Path; from polyspec.models.gguf_convert import convert_gguf; convert_gguf(Path('/tmp/m/smollm2.gguf'), Path('/tmp/v'))") || exit 1
  (cd /tmp && python3 -m polyspec.cli train --help | head -n 5)
  ;;
go)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl3/*.whl || exit 1
  rm -rf $R && mkdir -p $R && tar xJf .device/$PACK/run.txz -C /tmp || exit 1  # $R: a new attempt's progress
  # training.prompts imports core.langid (wordfreq): language ID ran here, so an empty module stands in there
  python3 -c "import wordfreq" 2>/dev/null || echo '"""Stand-in: language ID runs on the CPU side."""' > /tmp/site/wordfreq.py
  cd /tmp  # not the checkout: there `-m polyspec.cli` would find ./polyspec/ without core/, models/... (/tmp/pkg has them)
  (cd /tmp && python3 -m polyspec.cli train status $RUN)
  setsid nohup bash -c "t0=\$(date +%s); python3 -m polyspec.cli train run --run-id $RUN --resume --gpus 1 --json \
    > $R/run.json 2> $R/run.log; echo \"exit \$? after \$(( \$(date +%s) - t0 )) s\" >> $R/progress.txt; touch $R/DONE" \
    > /dev/null 2>&1 < /dev/null &
  cd "$OLDPWD"
  if [ -n "${UNSEEN:-}" ]; then  # NAME=DIR ...: measured beside the run's own evaluation, once its fit is done
    rm -rf /tmp/unseen-in /tmp/unseen && mkdir -p /tmp/unseen-in/drafts && cp bench/data/unseen/*.jsonl \
      scripts/multilingual_device.sh /tmp/unseen-in/ || exit 1
    args=(); for d in $UNSEEN; do cp -r "${d#*=}" "/tmp/unseen-in/drafts/${d%%=*}" && args+=("${d%%=*}=/tmp/unseen-in/drafts/${d%%=*}"); done
    setsid nohup bash -c "while [ ! -f /tmp/pshome/runs/$RUN/fit/DONE.json ]; do [ -f $R/DONE ] && exit 1; sleep 5; done; \
      cd $PWD && UNSEEN_DIR=/tmp/unseen-in RUN=$RUN bash /tmp/unseen-in/multilingual_device.sh unseen ${args[*]}" \
      > /dev/null 2>&1 < /dev/null &
  fi
  wait_done "${2:-540}"
  collect
  ;;
wait)
  wait_done "${2:-540}"
  collect
  ;;
unseen)  # the new draft (as RUN), then each NAME=DIR; prompts: UNSEEN_DIR/*.jsonl; figures in /tmp/unseen
  shift; rm -rf /tmp/ud /tmp/unseen && mkdir -p /tmp/ud /tmp/unseen && ln -s /tmp/pshome/runs/$RUN/fit/draft /tmp/ud/$RUN
  bench=$(realpath "${UNSEEN_DIR:-bench/data/unseen}")
  drafts=(/tmp/ud/$RUN)
  for d in "$@"; do ln -s "$(realpath "${d#*=}")" "/tmp/ud/${d%%=*}" && drafts+=("/tmp/ud/${d%%=*}"); done
  here=$PWD && cd /tmp || exit 1
  # one file, each record labelled with its file's language: the verifier answers once, in batches over all
  python3 - "$bench"/*.jsonl > /tmp/unseen/all.jsonl <<'PY' || exit 1
import json, sys
from pathlib import Path
for f in map(Path, sys.argv[1:]):
    for line in f.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            rec = rec if isinstance(rec, dict) else {"prompt": rec}
            print(json.dumps({**rec, "lang": f.stem}, ensure_ascii=False))
PY
  python3 -m polyspec.cli eval "${drafts[@]}" --bench /tmp/unseen/all.jsonl --k 3 --verifier /tmp/v \
    --json /tmp/unseen/results.json 2>&1 | grep -v -E '━|Loading weights|Warning|warn' | tail -n 60 | cut -c1-200 \
    > /tmp/unseen/eval.log
  cd "$here" && cat /tmp/unseen/eval.log
  ;;
*) echo "unknown command $cmd"; exit 2 ;;
esac
