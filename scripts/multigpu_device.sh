#!/usr/bin/env bash
# On the GPU machine: `polyspec train run --gpus N` (torchrun, NCCL, FSDP2, bf16) against the
# one-process path, on the same prompts, answers, hidden states and seed.
#
#   bash scripts/multigpu_prep.sh                    # here: the run's prompts stage, the CLI's wheels, the base draft
#   bash scripts/multigpu_device.sh prep             # device call 1 (carry .device/m1 .device/whl): wheels, package
#                                                    #   (scripts/device_prep.sh)
#   bash scripts/multigpu_device.sh stage            # call 2 (carry .device/m2 .device/p18): verifier, CLI wheels, run
#   bash scripts/multigpu_device.sh go GPUS WAIT "SEEDS"  # call 3 (carry .device/en): the English base, then in
#                                                    #   the background per seed the run under --gpus GPUS and
#                                                    #   the same data fitted in one process (--reuse-from);
#                                                    #   waits WAIT s (540)
#   bash scripts/multigpu_device.sh wait [WAIT]      # later calls: wait, then bring back what is new
#
# A device call from a checkout with the shipped drafts is over the 64 MiB that travels: before calling,
# untrack them for the session (`git rm -q -r --cached models/drafts/smollm2-135m-instruct-*` plus
# `.git/info/exclude`; `git reset -q` afterwards). Each run's stage summaries (--json), its log and its run
# directory's small JSON files come back under $OUT; stage times are in the summaries. With a kind of several
# GPUs, GPUS=2 or 4 gives the rows that docs/results/multigpu.json needs.
set -u
cmd=${1:-wait}
export PYTHONPATH=/tmp/site:/tmp/pkg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 POLYSPEC_HOME=/tmp/pshome
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r18
start=$(date +%s)

runs() {  # in the background, per seed: the prepared run under --gpus N, then the one-process fit of its data
  local gpus=$1 seeds=$2
  cd /tmp  # not the checkout: there `-m polyspec.cli` would find ./polyspec/ without core/, models/... (/tmp/pkg has them)
  for seed in $seeds; do  # the one-process run takes every knob from the prepared run's run.json (--config)
    local run=fr-g1-s$seed
    for spec in "$run|--run-id $run --resume --gpus $gpus" \
                "fr-g0-s$seed|fr --config $POLYSPEC_HOME/runs/$run/run.json --reuse-from $run --run-id fr-g0-s$seed"; do
      local name=${spec%%|*} t0=$(date +%s.%N)
      # shellcheck disable=SC2086  # the arguments are words
      python3 -m polyspec.cli train run ${spec#*|} --json > "$R/$name.json" 2> "$R/$name.log"
      echo "$name: exit $? after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" >> "$R/progress.txt"
    done
  done
  touch $R/DONE
}

collect() {
  cp $R/progress.txt $R/*.json "$OUT/" 2>/dev/null
  for f in $R/*.log; do [ -f "$f" ] && tail -c 100000 "$f" > "$OUT/$(basename "$f")"; done
  # the runs' small JSON files: stage markers (DONE.json, with their seconds), summaries, evaluation
  [ -d /tmp/pshome/runs ] && (cd /tmp/pshome/runs && find . -name '*.json' -size -2M -not -path '*/answers/shards/*' \
    -not -path '*/checkpoints/*' | tar -czf "$OUT/runs-files.tgz" -T -)
  cat $R/progress.txt 2>/dev/null
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
}

case "$cmd" in
prep) bash scripts/device_prep.sh ;;  # the wheels, the first half of the verifier, /tmp/pkg
stage)
  mkdir -p /tmp/m && cp .device/m2/part01 /tmp/m/ && cat /tmp/m/part00 /tmp/m/part01 > /tmp/m/smollm2.gguf || exit 1
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/m/smollm2.gguf" | sha256sum -c - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/p18/whl/*.whl \
    || exit 1
  [ -f /tmp/v/model.safetensors ] || (cd /tmp && python3 -c "from pathlib import Path; from polyspec.models.gguf_convert import convert_gguf; convert_gguf(Path('/tmp/m/smollm2.gguf'), Path('/tmp/v'))") || exit 1
  # the run made here: its paths are the same there (/tmp/p18, /tmp/pshome, /tmp/v)
  tar xzf .device/p18/run.tgz -C /tmp || exit 1
  cd /tmp && python3 -m polyspec.cli train list
  ;;
go)
  mkdir -p /tmp/p18/en $R && cp -r .device/en/. /tmp/p18/en/ || exit 1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  setsid nohup bash "$0" runs "${2:-1}" "${4:-0}" > $R/runs.out 2>&1 < /dev/null &  # outlives this call
  wait_s=${3:-540}
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - start )) -lt "$wait_s" ]; do sleep 5; done
  collect
  ;;
runs) runs "${2:-1}" "${3:-0}" ;;
wait)
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - start )) -lt "${2:-540}" ]; do sleep 5; done
  collect
  ;;
*) echo "unknown command $cmd"; exit 2 ;;
esac
