#!/usr/bin/env bash
# On a lent GPU machine (any GPU count): where vLLM's bf16 behaviour logprobs and the
# trainer's recomputation part (benchmarks/device/logprob_gap.py), then the chosen settings
# checked in a run. One phase per `run` call, back to back (the machine stays warm ~30 s):
#   stage1  carry .vllm/a             vLLM overlay part 1
#   stage2  carry .vllm/b .whl .tf    vLLM part 2, wheels, transformers 5.24
#   stage3  carry .models/a           model part 1
#   gap     carry .models/b           sampling with each vLLM variant (VARIANTS), one per GPU at a
#                                     time, then every trainer-side recomputation of each
#   run     carry .models/b           60-step `areal train engine=vllm` runs, bfloat16 on GPUs 0,1 and
#                                     float16 on GPUs 2,3 (logp_gap_fresh per step), then the
#                                     ablation on each final checkpoint
#   sync    carry .models/b           the same two runs synchronous (max_staleness=0: every token is
#                                     sampled with the weights being trained, so every step has a gap)
#   hf16    carry .models/b           one GPU (after stage2 and stage3 only): engine=hf, trainer and
#                                     engine colocated, precision=fp16, synchronous, 20 steps
# Results: $OUT/summary.txt, $OUT/gap/*.json, logs in $OUT/<phase>_logs.tgz.
set -u
phase=${1:?phase}
LOGS=/tmp/s4logs/$phase
source benchmarks/device/common.sh
NG=$(nvidia-smi -L | wc -l)
table() {  # FILE [FAMILY]: the means of each row of a score table (only FAMILY's rows if given)
  python3 - "$@" <<'PY' | tee -a $S
import json, sys
r = json.load(open(sys.argv[1]))
for line in r["table"]:
    if len(sys.argv) < 3 or line["family"] == sys.argv[2]:
        print(json.dumps({k: (v[0] if isinstance(v, list) else v) for k, v in line.items()}))
if r["errors"]:
    print("errors", r["errors"])
PY
}

if [ "$phase" = gap ]; then
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  D=/tmp/gap; mkdir -p $D $OUT/gap
  read -r -a V <<< "${VARIANTS:-compiled eager native fa2 batch_invariant native_fa2}"
  i=0
  for v in "${V[@]}"; do  # NG samplers at a time
    env_v=""; [ "$v" = batch_invariant ] && env_v="VLLM_BATCH_INVARIANT=1"
    ( step gen_$v 300 env $env_v CUDA_VISIBLE_DEVICES=$((i % NG)) python3 benchmarks/device/logprob_gap.py gen \
          $MODEL $D/gen_$v.pt --variant $v --n ${N:-48} ) &
    i=$((i + 1)); [ $((i % NG)) -eq 0 ] && wait
  done
  wait
  i=0
  for v in "${V[@]}"; do
    [ -f $D/gen_$v.pt ] || continue
    fa=3; case $v in *fa2) fa=2 ;; esac  # the trainer-side vllm_fa uses the sampler's FlashAttention
    ( step score_$v 300 env FA_VERSION=$fa CUDA_VISIBLE_DEVICES=$((i % NG)) python3 benchmarks/device/logprob_gap.py score \
          $MODEL $OUT/gap/$v.json $D/gen_$v.pt ${SCORE:+--score-only $SCORE} ) &
    i=$((i + 1)); [ $((i % NG)) -eq 0 ] && wait
  done
  wait
  for f in $OUT/gap/*.json; do table $f all; done
  tar czf $OUT/gap_logs.tgz -C /tmp s4logs 2>/dev/null
fi

gap_on() {  # name model gpu variant score-variants...
  local name=$1 m=$2 g=$3 v=$4; shift 4
  step gen_$name 200 env CUDA_VISIBLE_DEVICES=$g python3 benchmarks/device/logprob_gap.py gen $m /tmp/gap/$name.pt \
      --variant $v --n ${N:-48} &&
  step score_$name 200 env CUDA_VISIBLE_DEVICES=$g python3 benchmarks/device/logprob_gap.py score $m \
      $OUT/gap/$name.json /tmp/gap/$name.pt --score-only "$@" && table $OUT/gap/$name.json; }

SHORT="task=basic_arithmetic trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=128 rollout.max_concurrent=0
       trainer.micro_batch_tokens=16384 trainer.packing=true launcher.peer_timeout_s=300 task.eval_size=200"
gap_run() {  # name gpus extra-overrides...: 60 steps with engine=vllm, its logp_gap_fresh per step
  local name=$1 gpus=$2; shift 2
  step $name 300 ${gap_run_cmd:-} python3 -m areal_cli.cli train --quiet engine=${ENGINE:-vllm} model=$MODEL $SHORT \
      cluster.gpus=[$gpus] run_dir=/tmp/runs/$name trainer.steps=${STEPS:-60} "$@"
  python3 - $name /tmp/runs/$name/metrics.jsonl <<'PY' | tee -a $S
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
g = [(r["logp_gap_fresh"], r["fresh_tokens"]) for r in rows if "logp_gap_fresh" in r]
w = sum(x * n for x, n in g) / max(1, sum(n for _, n in g))
print(f"{sys.argv[1]}: logp_gap_fresh over {len(g)} steps: token-weighted {w:.4f}, median"
      f" {statistics.median(x for x, _ in g):.4f}, first 10 {statistics.mean(x for x, _ in g[:10]):.4f},"
      f" last 10 {statistics.mean(x for x, _ in g[-10:]):.4f}; fresh tokens {sum(n for _, n in g)}")
print("  per step", [round(x, 4) for x, _ in g])
r = [x["reward_mean"] for x in rows if x.get("reward_mean") is not None]
print("  reward first/last 10:", round(statistics.mean(r[:10]), 3), round(statistics.mean(r[-10:]), 3),
      " wall", round(rows[-1]["wall_time_s"], 1), "s; skipped steps", rows[-1].get("skipped_steps"),
      "loss scale", rows[-1].get("loss_scale"))
PY
}

if [ "$phase" = run ]; then
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  mkdir -p /tmp/gap $OUT/gap
  ( gap_run bf16_60 0,1
    gap_on trained_bf16 /tmp/runs/bf16_60/checkpoints/final 0 compiled sdpa trainer fp32 ) &
  ( gap_run fp16_60 2,3 engine.dtype=float16 trainer.dtype=float16
    gap_on trained_fp16 /tmp/runs/fp16_60/checkpoints/final 2 fp16 fp16_sdpa fp16_trainer trainer fp32 ) &
  wait
  tar czf $OUT/run_logs.tgz -C /tmp s4logs runs/bf16_60/metrics.jsonl runs/fp16_60/metrics.jsonl runs/bf16_60/logs \
      runs/fp16_60/logs 2>/dev/null
fi

if [ "$phase" = sync ]; then
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  export STEPS=${STEPS:-40}
  gap_run bf16_sync 0,1 rollout.max_staleness=0 &
  gap_run fp16_sync 2,3 rollout.max_staleness=0 engine.dtype=float16 trainer.dtype=float16 &
  wait
  tar czf $OUT/sync_logs.tgz -C /tmp s4logs runs/bf16_sync/metrics.jsonl runs/fp16_sync/metrics.jsonl 2>/dev/null
fi

if [ "$phase" = hf16 ]; then
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  STEPS=20 ENGINE=hf gap_run_cmd="$TF" gap_run hf16 0 rollout.max_staleness=0 precision=fp16
fi
