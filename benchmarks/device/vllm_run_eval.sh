#!/usr/bin/env bash
# One `areal train engine=vllm` run with its closing evaluation (base vs trained, greedy, held-out),
# as a user runs it, on a lent 2-GPU machine (kind nvidia-h100-x2): trainer on GPU 0, vLLM worker on
# GPU 1, the closing evaluation on the worker's GPU; then `areal eval engine=vllm` of the same two
# models, data-parallel over both GPUs, whose accuracies must equal the closing evaluation's.
#   stage1  carry .vllm/a              vLLM overlay part 1
#   stage2  carry .vllm/b .whl         vLLM part 2, wheels
#   stage3  carry .models/a            default model part 1
#   run     carry .models/b .whl       the run, its summary, the data-parallel evaluation
# Env: STEPS (30), BUDGET (seconds of the call, 570).
# Results: $OUT/summary.txt, $OUT/run.json (run_summary.py), $OUT/eval_final.json, $OUT/eval_dp.json,
# $OUT/runs.tgz (run directory without checkpoints, logs).
set -u
phase=${1:?phase}
source benchmarks/device/common.sh
[ "$phase" = run ] || { echo "unknown phase $phase (stage1 stage2 stage3 run)"; exit 2; }
M=$(model)
TAIL=16 step train 420 python3 -m areal_cli.cli train run_dir=/tmp/runs/vllm engine=vllm model=$M \
  cluster.gpus=[0,1] trainer.steps=${STEPS:-30} trainer.batch_size=32 rollout.group_size=8 \
  rollout.max_new_tokens=128 rollout.max_concurrent=0 trainer.micro_batch_tokens=16384 \
  launcher.peer_timeout_s=300 task.eval_size=200 eval.size=200 eval.at_end=true
python3 benchmarks/device/run_summary.py /tmp/runs/vllm 2 > "$OUT/run.json" 2>> "$L/summary.log"
python3 - "$OUT/run.json" <<'PY' | tee -a $S
import json, sys
s = json.load(open(sys.argv[1]))
for k in ("steps", "wall_time_s", "step_wall_s_median", "weight_sync_s_median", "update_pause_s_median",
          "effective_trained_tokens_per_s", "reward_first_quarter", "reward_last_quarter", "staleness_mean"):
    print(f"{k:32s} {s.get(k)}")
PY
cp /tmp/runs/vllm/eval_final.json "$OUT/" 2>/dev/null || echo "no eval_final.json: the closing evaluation did not finish" | tee -a $S
TAIL=8 step eval_dp 240 python3 -m areal_cli.cli eval engine=vllm gpus=[0,1] \
  "models=[$M,/tmp/runs/vllm/checkpoints/final]" size=200 task.eval_size=200 max_new_tokens=128 \
  max_concurrent=256 out_dir=/tmp/runs/eval_dp
cp /tmp/runs/eval_dp/*.json "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude=checkpoints -C /tmp runs logs 2>/dev/null
echo "== done ($phase, $(date -u +%T))" | tee -a $S
