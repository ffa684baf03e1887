#!/usr/bin/env bash
# Session 4 on a lent GPU machine (any GPU count): where vLLM's bf16 behaviour logprobs and the
# trainer's recomputation part (benchmarks/device/logprob_gap.py), then the chosen settings
# checked in a run. One phase per `run` call, back to back (the machine stays warm ~30 s):
#   stage1  carry .vllm/a             vLLM overlay part 1
#   stage2  carry .vllm/b .whl .tf    vLLM part 2, wheels, transformers 5.24
#   stage3  carry .models/a           model part 1
#   gap     carry .models/b           sampling with each vLLM variant (VARIANTS), one per GPU at a
#                                     time, then every trainer-side recomputation of each
# Results: $OUT/summary.txt, $OUT/gap/*.json, logs in $OUT/gap_logs.tgz.
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
