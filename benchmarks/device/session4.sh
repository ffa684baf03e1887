#!/usr/bin/env bash
# Session 4 on a lent GPU machine (any GPU count): where vLLM's bf16 behaviour logprobs and the
# trainer's recomputation part (benchmarks/device/logprob_gap.py), then the chosen settings
# checked in a run. One phase per `run` call, back to back (the machine stays warm ~30 s):
#   stage1  carry .vllm/a             vLLM overlay part 1
#   stage2  carry .vllm/b .whl .tf    vLLM part 2, wheels, transformers 5.24
#   stage3  carry .models/a           model part 1
#   gap     carry .models/b           sampling with each vLLM variant (VARIANTS), one per GPU at a
#                                     time, then every trainer-side recomputation of each
#   run     carry .models/b           GPUs 0,1: a 60-step `areal train engine=vllm` (its logp_gap_fresh
#                                     per step), then the ablation on its final checkpoint;
#                                     GPUs 2,3: the float16 ablation on the base model
# Results: $OUT/summary.txt, $OUT/gap/*.json, logs in $OUT/<phase>_logs.tgz.
set -u
phase=${1:?phase}
LOGS=/tmp/s4logs/$phase
source benchmarks/device/common.sh
NG=$(nvidia-smi -L | wc -l)

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
  for f in $OUT/gap/*.json; do python3 - "$f" <<'PY' | tee -a $S
import json, sys
r = json.load(open(sys.argv[1]))
for line in r["table"]:
    if line["family"] == "all" or "--families" in sys.argv:
        print(json.dumps({k: (v[0] if isinstance(v, list) else v) for k, v in line.items()}))
if r["errors"]:
    print("errors", r["errors"])
PY
  done
  tar czf $OUT/gap_logs.tgz -C /tmp s4logs 2>/dev/null
fi

table() { python3 - "$1" <<'PY' | tee -a $S
import json, sys
r = json.load(open(sys.argv[1]))
for line in r["table"]:
    print(json.dumps({k: (v[0] if isinstance(v, list) else v) for k, v in line.items()}))
if r["errors"]:
    print("errors", r["errors"])
PY
}
gap_on() {  # name model gpu variant score-variants...
  local name=$1 m=$2 g=$3 v=$4; shift 4
  step gen_$name 200 env CUDA_VISIBLE_DEVICES=$g python3 benchmarks/device/logprob_gap.py gen $m /tmp/gap/$name.pt \
      --variant $v --n ${N:-48} &&
  step score_$name 200 env CUDA_VISIBLE_DEVICES=$g python3 benchmarks/device/logprob_gap.py score $m \
      $OUT/gap/$name.json /tmp/gap/$name.pt --score-only "$@" && table $OUT/gap/$name.json; }

if [ "$phase" = run ]; then
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  mkdir -p /tmp/gap $OUT/gap
  ( gap_on base_fp16 $MODEL 2 fp16 sdpa trainer fp16_sdpa fp16_trainer compiled ) &
  ( step train60 300 python3 -m areal_cli.cli train --quiet engine=vllm model=$MODEL $SHORT cluster.gpus=[0,1] \
        run_dir=/tmp/runs/gap60 trainer.steps=60
    python3 - /tmp/runs/gap60/metrics.jsonl <<'PY' | tee -a $S
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
g = [(r["step"], r["logp_gap_fresh"], r["fresh_tokens"]) for r in rows if "logp_gap_fresh" in r]
w = sum(x[1] * x[2] for x in g) / max(1, sum(x[2] for x in g))
print(f"logp_gap_fresh over {len(g)} steps: token-weighted {w:.4f}, median {statistics.median(x[1] for x in g):.4f},"
      f" first 10 {statistics.mean(x[1] for x in g[:10]):.4f}, last 10 {statistics.mean(x[1] for x in g[-10:]):.4f};"
      f" fresh tokens {sum(x[2] for x in g)}")
print("per step", [round(x[1], 4) for x in g])
r = [x.get("reward_mean") for x in rows if x.get("reward_mean") is not None]
print("reward first/last 10:", round(statistics.mean(r[:10]), 3), round(statistics.mean(r[-10:]), 3))
PY
    F=/tmp/runs/gap60/checkpoints/final
    ( gap_on trained $F 0 compiled sdpa trainer compiled fp32 ) &
    ( gap_on trained_fp16 $F 1 fp16 sdpa fp16_sdpa fp16_trainer ) &
    wait ) &
  wait
  tar czf $OUT/run_logs.tgz -C /tmp s4logs runs/gap60/metrics.jsonl runs/gap60/logs 2>/dev/null
fi
