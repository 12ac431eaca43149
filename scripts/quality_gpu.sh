#!/usr/bin/env bash
# scripts/quality_gpu.py on the GPU machine, in calls of at most 10 minutes.
#
#   bash scripts/quality_gpu.sh prep [nosmoke]    # call 1 (carry .device/m1 .device/whl .qdata/tok .qdata/smoke):
#                                                 #   wheels, the staged package, a smoke run on a tiny verifier
#   bash scripts/quality_gpu.sh launch SECONDS SHA [WAIT]  # call 2 (carry .device/m2 .qdata/pools): the verifier,
#                                                 #   then the run in the background, ending SECONDS from now; waits
#                                                 #   WAIT s (530) from the call's start
#   bash scripts/quality_gpu.sh wait SECONDS      # later calls: wait, then bring back what is new
#   (Q_LANGS: only those phases; one draft for several languages: scripts/multilingual_device.sh)
#   bash scripts/quality_gpu.sh ship              # (carry .qship) hand the stripped shipped drafts to the run
#
# The run lives in /tmp/q and outlives each call (setsid); every call ends with `collect`: run state (eval,
# provenance, curves, logs) as one archive, and the drafts finished since the last call, tarred and split in
# parts of 15 MiB (at most 4 a call: the tool brings back 8 files of at most 16 MiB, 64 MiB in all).
set -u
cmd=${1:-wait}
arg=${2:-500}
start=$(date +%s)
export PYTHONPATH=/tmp/site:/tmp/pkg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 POLYSPEC_HOME=/tmp/pshome
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
Q=${Q:-/tmp/q}

stage() {  # the package as installed: polyspec/ plus core/ models/ ... mapped to polyspec.* (pyproject package-dir)
  rm -rf /tmp/pkg && mkdir -p /tmp/pkg/polyspec
  for f in polyspec/*.py; do ln -s "$PWD/$f" /tmp/pkg/polyspec/; done
  for d in core models registry router training; do ln -s "$PWD/$d" "/tmp/pkg/polyspec/$d"; done
}

collect() {
  mkdir -p $Q/sent
  [ -d $Q/run ] || return 0
  tar -czf "$OUT/state.tgz" -C $Q run/eval.json run/run.json run/curves.json run/mtbench_answers.json run/metrics \
    run/log.txt 2>/dev/null
  new=()
  for d in $(ls -tr $Q/run/transport/*.done 2>/dev/null); do
    n=$(basename "$d" .done)
    [ -f "$Q/sent/$n" ] || new+=("$n")
  done
  [ ${#new[@]} = 0 ] && { echo "no new drafts"; return 0; }
  k=$(ls $Q/sent | wc -l)
  take=(); bytes=0
  for n in "${new[@]}"; do
    b=$(du -sb "$Q/run/transport/$n" | cut -f1)
    [ $((bytes + b)) -gt 62000000 ] && break
    take+=("$n"); bytes=$((bytes + b))
  done
  tar -cf $Q/ship-$k.tar -C $Q/run/transport "${take[@]}"
  (cd $Q && split -b 15M -d -a 1 ship-$k.tar "$OUT/drafts-$k.part" && sha256sum ship-$k.tar > "$OUT/drafts-$k.sha256")
  for n in "${take[@]}"; do touch "$Q/sent/$n"; done
  echo "sent drafts: ${take[*]} ($bytes bytes)"
}

progress() {
  grep -v -i -E 'warn|loading weights|writing model' $Q/run/log.txt 2>/dev/null | tail -n 25 | cut -c1-220
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
}

case "$cmd" in
prep)
  mkdir -p /tmp/m && cp .device/m1/part00 /tmp/m/ || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl || exit 1
  stage
  python3 -c "import torch, transformers, speculators; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
  [ "$arg" = nosmoke ] && exit 0  # the smoke already passed elsewhere (e.g. --device cpu here): no device time on it
  python3 scripts/quality_data.py tiny .qdata/tok /tmp/tiny || exit 1
  rm -rf /tmp/smoke
  timeout 300 python3 scripts/quality_gpu.py --verifier /tmp/tiny --pools .qdata/smoke --out /tmp/smoke --smoke \
    --deadline $(( $(date +%s) + 100 )) --langs en,it,ko 2>&1 | grep -v -i -E 'warn|loading weights|writing model' | tail -n 30
  ls /tmp/smoke/transport; python3 -c "import json; r=json.load(open('/tmp/smoke/run.json')); print(r.get('errors'), r['skipped'])"
  cp /tmp/smoke/run.json "$OUT/smoke-run.json"
  ;;
launch)
  mkdir -p /tmp/m && cp .device/m2/part01 /tmp/m/ && cat /tmp/m/part00 /tmp/m/part01 > /tmp/m/smollm2.gguf || exit 1
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/m/smollm2.gguf" | sha256sum -c - || exit 1
  mkdir -p /tmp/qdata && cp -r .qdata/pools /tmp/qdata/ || exit 1
  [ -d /tmp/pkg ] || stage
  [ -f /tmp/v/model.safetensors ] || (cd /tmp && python3 -c "from pathlib import Path; from polyspec.models.gguf_convert import convert_gguf; convert_gguf(Path('/tmp/m/smollm2.gguf'), Path('/tmp/v'))") || exit 1
  mkdir -p $Q/run
  deadline=$(( start + arg ))
  # only the languages whose pools were carried (a run that carried en, it, ko without --langs: the other
  # phases failed on the missing pools and their share of the time went unused)
  langs=${Q_LANGS:-$(cd /tmp/qdata/pools && ls *.jsonl.gz | sed 's/\.jsonl\.gz$//' | paste -sd, -)}
  echo "languages: $langs"
  setsid nohup python3 scripts/quality_gpu.py --verifier /tmp/v --pools /tmp/qdata/pools --out $Q/run --langs "$langs" \
    --deadline $deadline --shipped $Q/shipped --embed-sha256 "${3:-}" >> $Q/run/log.txt 2>&1 < /dev/null &
  echo "launched pid $! deadline $deadline ($(( deadline - $(date +%s) ))s from now)"
  arg=${4:-530}
  ;&
wait)
  while [ ! -f $Q/run/DONE ] && [ $(( $(date +%s) - start )) -lt "$arg" ]; do sleep 5; done
  progress
  collect
  ;;
ship)
  mkdir -p $Q/shipped && cp -r .qship/* $Q/shipped/ && touch $Q/shipped/READY && ls $Q/shipped
  arg=${2:-480}
  while [ ! -f $Q/run/DONE ] && [ $(( $(date +%s) - start )) -lt "$arg" ]; do sleep 5; done
  progress
  collect
  ;;
*) echo "unknown command $cmd"; exit 2 ;;
esac
