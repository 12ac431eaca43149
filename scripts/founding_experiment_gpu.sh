#!/usr/bin/env bash
# The founding experiment on the GPU machine, in calls of at most 10 minutes (docs/results.md §6).
#
#   bash scripts/founding_experiment_gpu.sh run SECONDS     # (re)start what has not finished, wait <= SECONDS
#   bash scripts/founding_experiment_gpu.sh round2 SECONDS  # then: FR on the better English base, a bigger base
#   bash scripts/founding_experiment_gpu.sh fetch N       # part N of the drafts worth shipping (4 x 15 MiB)
#
# `run` is idempotent: every stage resumes from its DONE marker and fit from its last epoch checkpoint.
# One evaluator measures each draft as soon as it is saved, so figures come back even if time runs out.
# Needs: /tmp/m/smollm2.gguf, /tmp/p (the data), /tmp/d/en and /tmp/d/fr (the shipped drafts), /tmp/site.
set -u
cmd=${1:-run}
arg=${2:-540}
start=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 POLYSPEC_HOME=/tmp/pshome TOKENIZERS_PARALLELISM=false
export FX_VERIFIER=/tmp/v PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# Six processes, each with as many CPU threads as cores, make every stage 5-10x slower: 6 threads each.
export OMP_NUM_THREADS=6 MKL_NUM_THREADS=6
W=/tmp/fx; R=/tmp/pshome/runs; mkdir -p $W/logs
ngpu=$(nvidia-smi -L | wc -l)
[ -f /tmp/v/model.safetensors ] || python3 -c "from pathlib import Path; from models.gguf_convert import convert_gguf; convert_gguf(Path('/tmp/m/smollm2.gguf'), Path('/tmp/v'))"
[ -f /tmp/p/code_train.jsonl ] || python3 scripts/founding_experiment.py data /tmp/p /tmp/p
FX="python3 scripts/founding_experiment.py"

if [ "$cmd" = fetch ]; then
  if [ ! -f /tmp/ship/list ]; then
    mkdir -p /tmp/ship
    $FX pick $W/eval*.json --data /tmp/p --base /tmp/d/en >/tmp/ship/list
    (cd $R && tar -cf /tmp/ship/drafts.tar $(sed 's|$|/fit/draft|' /tmp/ship/list) $(sed 's|$|/run.json|' /tmp/ship/list))
    split -b 15M -d -a 2 /tmp/ship/drafts.tar /tmp/ship/part-
    sha256sum /tmp/ship/drafts.tar >/tmp/ship/drafts.sha256
  fi
  cat /tmp/ship/list; ls -l /tmp/ship
  cp /tmp/ship/list /tmp/ship/drafts.sha256 "$OUT/"
  for i in 0 1 2 3; do p=/tmp/ship/part-$(printf %02d $((arg * 4 + i))); [ -f "$p" ] && cp "$p" "$OUT/"; done
  exit 0
fi

alive() { [ -f "$W/$1.pid" ] && kill -0 "$(cat "$W/$1.pid")" 2>/dev/null; }
launch() {  # name gpu command...
  local name=$1 gpu=$2; shift 2
  if [ -f "$W/$name.done" ] || alive "$name"; then return; fi
  CUDA_VISIBLE_DEVICES=$((gpu % ngpu)) setsid nohup bash -c "$* && touch $W/$name.done" >>"$W/logs/$name.log" 2>&1 &
  echo $! >"$W/$name.pid"
  echo "started $name on gpu $((gpu % ngpu))"
}
train() { echo "$FX train --runs $1 --data /tmp/p --base /tmp/d/en --home /tmp/pshome --report $W/report-$2.json"; }

if [ "$cmd" = round2 ]; then
  # Second round, once the first is done: French fine-tunes of en-curve (the better English base; data
  # stages reused, so fit only) and a bigger English base, with their own evaluation (eval2.json).
  launch w5 0 "$(train fr-curve-founding,fr-curve-more-8ep w5)"
  launch w6 1 "$(train en-big w6)"
  ck=""; for e in $(seq 0 11); do ck="$ck,ckpt:big-epoch-$e=$R/en-big/fit/checkpoints/epoch-$e/state.pt"; done
  drafts="base=/tmp/d/en"; for n in fr-curve-founding fr-curve-more-8ep en-big en-curve; do drafts="$drafts,$n=$R/$n/fit/draft"; done
  launch e1 0 "$FX evaluate --verifier /tmp/v --code-heldout /tmp/p/code_heldout.jsonl --out $W/eval2.json --wait 900 --drafts $drafts --checkpoints ${ck#,}"
  workers="w5 w6 e1"
else
# Two trainers per GPU (priority first in each queue), plus the evaluator.
launch w1 0 "$(train fr-founding,fr-lr,fr-8ep,de-founding,es-founding,code w1)"
launch w2 0 "$(train en-curve,fr-more,fr-more-8ep w2)"
launch w3 1 "$(train ja-ft,ja-scratch,ru-ft,ru-scratch w3)"
launch w4 1 "$(train zh-ft,zh-scratch,de-replay,es-replay w4)"
runs="fr-founding de-founding es-founding ja-ft ja-scratch zh-ft zh-scratch ru-ft ru-scratch code fr-lr fr-8ep de-replay es-replay fr-more en-curve fr-more-8ep"
drafts="base=/tmp/d/en,fr-shipped=/tmp/d/fr"; for n in $runs; do drafts="$drafts,$n=$R/$n/fit/draft"; done
ck=""; for e in $(seq 0 11); do ck="$ck,ckpt:epoch-$e=$R/en-curve/fit/checkpoints/epoch-$e/state.pt"; done
launch e0 1 "$FX evaluate --verifier /tmp/v --code-heldout /tmp/p/code_heldout.jsonl --out $W/eval.json --wait 1500 --drafts $drafts --checkpoints ${ck#,}"
  workers="w1 w2 w3 w4 e0"
fi

while :; do
  running=0
  for n in $workers; do [ -f "$W/$n.done" ] || { alive "$n" && running=1; }; done
  [ $running = 0 ] && break
  [ $(( $(date +%s) - start )) -ge "$arg" ] && break
  sleep 10
done

# What comes back: the evaluation, and one archive of reports, logs, fit metrics and loss plots.
for n in $workers; do printf '%s: %s\n' "$n" "$([ -f $W/$n.done ] && echo done || (alive $n && echo running || echo stopped))"; done
grep -ho '^[a-z0-9:-]*: [0-9.]*s$\|^[a-z0-9:-]*: FAILED.*' $W/logs/e*.log 2>/dev/null | tr '\n' ' '; echo
cp $W/eval*.json "$OUT/" 2>/dev/null
tar -czf "$OUT/fx-state.tgz" -C / tmp/fx/logs $(cd / && ls tmp/fx/report-*.json 2>/dev/null) \
  $(cd / && ls -d tmp/pshome/runs/*/fit/metrics.jsonl tmp/pshome/runs/*/fit/loss.png tmp/pshome/runs/*/*/DONE.json tmp/pshome/runs/*/run.json tmp/pshome/runs/*/prompts/stats.json 2>/dev/null) 2>/dev/null
tail -n 2 $W/logs/w*.log | cut -c1-160
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
