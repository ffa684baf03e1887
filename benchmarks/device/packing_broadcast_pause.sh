#!/usr/bin/env bash
# Trainer throughput (packing), weight broadcast bandwidth, pause with engine=hf and vllm,
# single-GPU colocated mode, on a lent 2-GPU machine. One phase per `run` call, back to back:
#   stage1  carry .vllm/a                   vLLM overlay part 1 (+ prints the machine)
#   stage2  carry .vllm/b .whl .tf          vLLM part 2, wheels, transformers 5.24 (-> /tmp/tf524)
#   stage3  carry .models/a                 model part 1
#   main    carry .models/b                 everything below, within BUDGET seconds (default 570)
# Results: $OUT/summary.txt, the JSON files and one tarball of logs, profiles and run records.
set -u
phase=${1:?phase}
LOGS=/tmp/s2logs TAIL=25
source benchmarks/device/common.sh
# the model (GGUF -> HF directory, once) on the CPU while the GPU benchmarks run
( python3 -c "from areal_cli.model_source import resolve_model; print(resolve_model('/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf'))" > /tmp/model_path 2> $L/convert.log ) &
CONV=$!
# 1. trainer throughput, packing vs padding, the run's workload shape (B=32 x G=8, short answers)
step packing 120 python3 benchmarks/packing.py --model random-135m --seqs 256 --group 8 --prompt 70 130 \
     --response 4 30 --micro-batch-tokens 16384 --packed-rows 16384 4096 2048 --host-mask --phases --steps 3 \
     --profile-dir $L/profiles --json $OUT/packing.json
grep -E "machine|batch:|packing=|phases|failed" $L/packing.log >> $S
# 2. weight broadcast: raw NCCL vs WeightSender -> WeightReceiver
step weight_broadcast 100 python3 benchmarks/weight_broadcast.py --models 1.5b 135m --bucket-mb 1024 256 --reps 5 \
     --out $OUT/weight_broadcast.json
sed -n '/^{/,/^}/p' $L/weight_broadcast.log >> $S
wait $CONV; MODEL=$(cat /tmp/model_path); echo "model: $MODEL" | tee -a $S
RUN="model=$MODEL trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=128 rollout.max_concurrent=0
     trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300 task.eval_size=200"
summ() { python3 benchmarks/device/run_summary.py /tmp/runs/$1 2 > $L/$1_summary.json 2>&1
  python3 - $1 $L/$1_summary.json <<'PY' | tee -a $S
import json, sys
try:
    s = json.load(open(sys.argv[2]))
except Exception as e:
    print(sys.argv[1], "no summary:", e); sys.exit()
keys = [k for k in s if any(w in k for w in ("pause", "step_time", "weight_sync", "busy", "staleness", "reward_", "wall", "steps", "tokens_per_s"))]
print(sys.argv[1], json.dumps({k: s[k] for k in keys}))
PY
  python3 - /tmp/runs/$1/weight_updates.jsonl <<'PY' | tee -a $S
import json, statistics, sys
try:
    p = [json.loads(l)["pause_total_s"] for l in open(sys.argv[1]) if "pause_total_s" in l]
    print(f"  pause_total_s n={len(p)} median={statistics.median(p)*1e3:.1f} ms min={min(p)*1e3:.1f} max={max(p)*1e3:.1f}")
except Exception as e:
    print("  pauses:", e)
PY
}
# 3. pause seen by generation: embedded hf engine (transformers 5.24), then vLLM, 2 GPUs
step train_hf 130 $TF python3 -m areal_cli.cli train --quiet engine=hf $RUN run_dir=/tmp/runs/hf10 trainer.steps=10
summ hf10
step train_vllm 170 python3 -m areal_cli.cli train --quiet engine=vllm $RUN run_dir=/tmp/runs/vllm10 trainer.steps=10
summ vllm10
# 4. single GPU, trainer and generator colocated
step train_coloc 150 $TF python3 -m areal_cli.cli train --quiet engine=hf cluster.gpus=[0] $RUN run_dir=/tmp/runs/coloc20 trainer.steps=20
summ coloc20
cp $L/*.log /tmp/runs/ 2>/dev/null
tar czf $OUT/packing_broadcast_pause.tgz --exclude=checkpoints -C /tmp runs s2logs 2>/dev/null
echo "done in $(( $(date +%s) - T0 )) s" | tee -a $S
