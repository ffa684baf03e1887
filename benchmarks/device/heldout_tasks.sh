#!/usr/bin/env bash
# Learning on reasoning-gym tasks that are not presets, measured on content-disjoint held-out
# problems: for each task a 100-step `areal train engine=vllm` run on 2 GPUs, then `areal eval` of
# the base model and the trained checkpoint on 200 held-out problems (greedy). Staging as in common.sh:
#   stage1  carry .vllm/a        stage2  carry .vllm/b .whl        stage3  carry .models/a
#   main    carry .models/b      the first two tasks at once (BUDGET s, default 570)
#   third   (no carry)           the third task (and a fourth, if given) the same way
# TASKS (default below) lists name:dataset:params, params as key=value joined by ';'.
# Results: $OUT/summary.txt, $OUT/<name>/eval.json|eval.md|splits, a tarball of run records.
set -u
phase=${1:?phase}
LOGS=/tmp/heldout_logs/$phase
source benchmarks/device/common.sh
TASKS=${TASKS:-"products:products:min_digits=1;max_digits=2 letter_counting:letter_counting:min_words=3;max_words=8 simple_equations:simple_equations:min_terms=2;max_terms=2;max_value=20"}
STEPS=${STEPS:-100}
RUN="trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=128 rollout.max_concurrent=0
     trainer.micro_batch_tokens=16384 trainer.packing=true launcher.peer_timeout_s=300 eval.at_end=false"

task_args() {  # name:dataset:k=v;k=v -> areal overrides
  local name=${1%%:*} rest=${1#*:}; local dataset=${rest%%:*} params=${rest#*:}
  echo -n "task=reasoning_gym task.name=$name task.dataset=$dataset task.eval_size=200"
  local IFS=";"; for kv in $params; do [ -n "$kv" ] && echo -n " task.params.$kv"; done; }

one() {  # spec gpus: train, then base vs trained on the held-out split
  local spec=$1 gpus=$2 name=${1%%:*}; local args; args=$(task_args "$spec")
  step train_$name 430 python3 -m areal_cli.cli train --quiet engine=vllm model=$MODEL $args $RUN \
       cluster.gpus=$gpus run_dir=/tmp/runs/$name trainer.steps=$STEPS
  python3 benchmarks/device/run_summary.py /tmp/runs/$name 2 > $OUT/${name}_run.json 2>&1
  step eval_$name 200 python3 -m areal_cli.cli eval models=[$MODEL,/tmp/runs/$name] $args size=200 \
       max_new_tokens=128 engine=vllm engine.vllm.enforce_eager=true gpus=$gpus max_concurrent=256 \
       out_dir=/tmp/runs/eval_$name
  mkdir -p $OUT/$name; cp /tmp/runs/eval_$name/eval.md /tmp/runs/eval_$name/eval.json $OUT/$name/ 2>/dev/null
  cp /tmp/runs/$name/splits.json /tmp/runs/$name/config.yaml $OUT/$name/ 2>/dev/null
  cat /tmp/runs/eval_$name/eval.md 2>/dev/null | tee -a $S; }

MODEL=$(model); echo "model: $MODEL" | tee -a $S
set -- $TASKS
if [ "$phase" = main ]; then  # the first two tasks at once
  ( one "$1" [0,1] ) &
  A=$!
  one "$2" [2,3]
  wait $A
fi
if [ "$phase" = third ]; then  # the third task on GPUs 0,1; a fourth, if TASKS has one, on 2,3
  if [ $# -ge 4 ]; then ( one "$4" [2,3] ) & fi
  one "$3" [0,1]
  wait
fi
tar czf $OUT/heldout_$phase.tgz --exclude=checkpoints -C /tmp runs heldout_logs 2>/dev/null
echo "done in $(( $(date +%s) - T0 )) s" | tee -a $S
