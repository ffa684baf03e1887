#!/usr/bin/env bash
# One `areal train engine=vllm` workload run by two versions of areal at once on a lent 4-GPU machine:
# the version in .base/ (an earlier commit: `mkdir -p .base && git archive REV areal_cli conf pyproject.toml |
# tar x -C .base`, ignored by git) on GPUs 0, 1 and this working tree on GPUs 2, 3, same seed and config.
# A refactor that should change no behaviour shows the same figures on both sides.
#   stage1   carry .vllm/a              vLLM overlay part 1
#   stage2   carry .vllm/b .whl         vLLM part 2, wheels
#   stage3   carry .models/a            default model part 1
#   compare  carry .models/b .whl .base both runs, then run_summary.py of each
# Env: STEPS (20), BUDGET (seconds of the call, 570).
# Results: $OUT/summary.txt, $OUT/base.json, $OUT/head.json, $OUT/compare_runs.tgz (run dirs, no checkpoints).
set -u
phase=${1:?phase}
LOGS=/tmp/cmplogs/$phase
source benchmarks/device/common.sh
[ "$phase" = compare ] || { echo "unknown phase $phase (stage1 stage2 stage3 compare)"; exit 2; }
[ -d .base/areal_cli ] || { echo "no .base/areal_cli: archive the earlier commit into .base first"; exit 2; }
M=$(model)
RUN="engine=vllm model=$M trainer.steps=${STEPS:-20} trainer.batch_size=32 rollout.group_size=8
     rollout.max_new_tokens=128 rollout.max_concurrent=0 trainer.micro_batch_tokens=16384
     launcher.peer_timeout_s=300 task.eval_size=200 eval.size=200"
step base 540 bash -c "cd .base && PYTHONPATH=$PWD/.base:$PYTHONPATH python3 -m areal_cli.cli train --quiet \
    run_dir=/tmp/runs/base cluster.gpus=[0,1] $(echo $RUN)" &
b=$!
sleep 2
step head 540 python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/head cluster.gpus=[2,3] $RUN
wait $b
for side in base head; do
  python3 benchmarks/device/run_summary.py /tmp/runs/$side 2 > "$OUT/$side.json" 2>> "$L/summary.log"
done
python3 - "$OUT/base.json" "$OUT/head.json" <<'PY' | tee -a $S
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = ("steps", "wall_time_s", "step_wall_s_median", "weight_sync_s_median", "update_pause_s_median",
        "effective_trained_tokens_per_s", "trainer_busy_fraction", "generation_busy_fraction",
        "reward_first_quarter", "reward_last_quarter", "staleness_mean")
print(f"{'figure':28s} {'base':>12s} {'head':>12s}")
for k in keys:
    f = lambda v: f"{v:.4g}" if isinstance(v, (int, float)) else str(v)
    print(f"{k:28s} {f(a.get(k)):>12s} {f(b.get(k)):>12s}")
for side, s in (("base", a), ("head", b)):
    r = s.get("response_length") or {}
    print(f"{side} response length p50/p90: {r.get('p50')}/{r.get('p90')}")
PY
grep -h "held-out\|accuracy" "$L/base.log" "$L/head.log" | tail -6 | tee -a $S
tar czf "$OUT/compare_runs.tgz" --exclude=checkpoints -C /tmp/runs base head 2>/dev/null
echo "== done ($phase, $(date -u +%T))" | tee -a $S
