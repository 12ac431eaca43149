#!/usr/bin/env bash
# The founding experiment on the GPU machine, in calls of at most 10 minutes (docs/results.md).
# Each call runs `PHASE=a bash scripts/founding_experiment_gpu.sh SECONDS`: it (re)starts whatever has not
# finished (every stage resumes from its DONE marker, fit from its last epoch checkpoint), waits at most
# SECONDS, and leaves reports, logs and evaluations in $OUT. Needs: /tmp/m/smollm2.gguf, /tmp/p (the data),
# /tmp/d/en and /tmp/d/fr (the shipped drafts), wheels installed in /tmp/site.
set -u
budget=${1:-540}
start=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 POLYSPEC_HOME=/tmp/pshome TOKENIZERS_PARALLELISM=false
export FX_VERIFIER=/tmp/v PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
W=/tmp/fx; mkdir -p $W/logs
ngpu=$(nvidia-smi -L | wc -l)
[ -f /tmp/v/model.safetensors ] || python3 -c "from pathlib import Path; from models.gguf_convert import convert_gguf; convert_gguf(Path('/tmp/m/smollm2.gguf'), Path('/tmp/v'))"
[ -f /tmp/p/code_train.jsonl ] || python3 scripts/founding_experiment.py data /tmp/p /tmp/p

alive() { [ -f "$W/$1.pid" ] && kill -0 "$(cat "$W/$1.pid")" 2>/dev/null; }
launch() {  # name gpu command...
  local name=$1 gpu=$2; shift 2
  if [ -f "$W/$name.done" ] || alive "$name"; then return; fi
  CUDA_VISIBLE_DEVICES=$((gpu % ngpu)) setsid nohup bash -c "$* && touch $W/$name.done" >>"$W/logs/$name.log" 2>&1 &
  echo $! >"$W/$name.pid"
  echo "started $name on gpu $((gpu % ngpu))"
}
train() { echo "python3 scripts/founding_experiment.py train --runs $1 --data /tmp/p --base /tmp/d/en --home /tmp/pshome --report $W/report-$2.json"; }
wait_for() {  # names...: wait while any runs, within the budget
  while :; do
    local running=0
    for n in "$@"; do [ -f "$W/$n.done" ] || { alive "$n" && running=1; }; done
    [ $running = 0 ] && return 0
    [ $(( $(date +%s) - start )) -ge "$budget" ] && return 1
    sleep 15
  done
}

# Two workers per GPU at most: six processes filled both H200s' memory and made every stage 5-10x
# slower (session 2). Phase a is what the results need first; phase b extends it.
phase=${PHASE:-a}
if [ "$phase" = a ]; then
  workers=(w1 w2 w3 w4)
  launch w1 0 "$(train fr-founding,de-founding,es-founding w1)"
  launch w2 0 "$(train de-replay,es-replay w2)"
  launch w3 1 "$(train ja-ft,ja-scratch w3)"
  launch w4 1 "$(train code,ru-ft,ru-scratch w4)"
else
  workers=(w5 w6 w7 w8)
  launch w5 0 "$(train en-curve w5)"
  launch w6 0 "$(train fr-more,fr-more-8ep w6)"
  launch w7 1 "$(train zh-ft,zh-scratch w7)"
  launch w8 1 "$(train ru-ft,ru-scratch w8)"
fi
trained=1
wait_for "${workers[@]}" || trained=0
for n in "${workers[@]}"; do [ -f "$W/$n.done" ] || trained=0; done

if [ $trained = 1 ]; then
  R=/tmp/pshome/runs
  d() { local out=""; for n in "$@"; do out="$out,$n=$R/$n/fit/draft"; done; echo "${out#,}"; }
  ck=""; for p in $R/en-curve/fit/checkpoints/epoch-*/state.pt; do e=$(basename "$(dirname "$p")"); ck="$ck,ckpt:$e=$p"; done
  ev="python3 scripts/founding_experiment.py evaluate --verifier /tmp/v --code-heldout /tmp/p/code_heldout.jsonl"
  launch e0 0 "$ev --out $W/eval-0.json --drafts base=/tmp/d/en,fr-shipped=/tmp/d/fr,$(d fr-founding fr-more fr-more-8ep de-founding de-replay en-curve code) --checkpoints ${ck#,}"
  launch e1 1 "$ev --out $W/eval-1.json --drafts $(d es-founding es-replay ru-ft ru-scratch zh-ft zh-scratch ja-ft ja-scratch)"
  # drafts a phase did not train fail to load and are recorded as errors; the other figures stay
  wait_for e0 e1
fi

# What comes back: evaluations, and one archive of reports, logs, fit metrics and loss plots.
for n in "${workers[@]}" e0 e1; do printf '%s: %s\n' "$n" "$([ -f $W/$n.done ] && echo done || (alive $n && echo running || echo stopped))"; done
cp $W/eval-*.json "$OUT/" 2>/dev/null
tar -czf "$OUT/fx-state.tgz" -C / tmp/fx/logs $(cd / && ls tmp/fx/report-*.json 2>/dev/null) \
  $(cd / && ls -d tmp/pshome/runs/*/fit/metrics.jsonl tmp/pshome/runs/*/fit/loss.png tmp/pshome/runs/*/*/DONE.json tmp/pshome/runs/*/run.json tmp/pshome/runs/*/prompts/stats.json 2>/dev/null) 2>/dev/null
tail -n 3 $W/logs/*.log | cut -c1-200
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
