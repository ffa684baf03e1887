#!/usr/bin/env bash
# On a lent 4-GPU machine (kind nvidia-h100-x4): weight broadcast, vLLM in-place
# updates and logprob agreement, pauses (hf and vllm), single-GPU colocated run, a 100-step run
# with `areal eval` of base vs trained, and `areal bench sync-vs-async` on 2 and 4 GPUs.
# One phase per `run` call, back to back (the machine stays warm ~30 s):
#   stage1  carry .vllm/a             vLLM overlay part 1
#   stage2  carry .vllm/b .whl .tf    vLLM part 2, wheels, transformers 5.24 (-> /tmp/tf524, for engine=hf)
#   stage3  carry .models/a           model part 1
#   main    carry .models/b           two tracks at once: GPUs 0,1 and GPUs 2,3 (BUDGET s, default 570)
#   bench2  (no carry)                bench on GPUs 0,1 (reload + abort) and on GPUs 2,3 (inplace + keep)
#   bench4  (no carry)                bench on all 4 GPUs (GEN/TRAIN/RGPUS/TGPUS/PAUSE/STEPS choose the layout)
#   extra   carry .models/b           vLLM in float32 (logprob agreement) and a 2-GPU run with in-place updates
#   coloc   carry .models/b           one GPU (kind nvidia-h200): the colocated run alone (stage2 + stage3 first)
# Results: $OUT/summary.txt, JSON files, PNGs and one tarball of logs and run records per phase.
set -u
phase=${1:?phase}
LOGS=/tmp/s3logs/$phase
source benchmarks/device/common.sh
summ() { python3 benchmarks/device/run_summary.py /tmp/runs/$1 2 > $L/$1_summary.json 2>&1
  python3 - $1 $L/$1_summary.json /tmp/runs/$1/weight_updates.jsonl <<'PY' | tee -a $S
import json, statistics, sys
try:
    s = json.load(open(sys.argv[2]))
    keys = [k for k in s if any(w in k for w in ("pause", "step_wall", "step_time", "weight_sync", "busy", "staleness",
                                                  "reward_", "wall_time", "steps", "tokens_per_s"))]
    print(sys.argv[1], json.dumps({k: s[k] for k in keys}))
except Exception as e:
    print(sys.argv[1], "no summary:", e)
try:
    rows = [json.loads(l) for l in open(sys.argv[3])]
    p = [r["pause_total_s"] for r in rows if "pause_total_s" in r]
    print(f"  pause_total_s n={len(p)} median={statistics.median(p)*1e3:.1f} ms min={min(p)*1e3:.1f} max={max(p)*1e3:.1f}")
    for k in ("weight_recv_s", "weight_load_s", "pause_wait_s", "resume_s"):
        v = [r[k] for r in rows if k in r]
        if v:
            print(f"  {k} median={statistics.median(v)*1e3:.1f} ms")
except Exception as e:
    print("  pauses:", e)
PY
}
SHORT="task=basic_arithmetic trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=128 rollout.max_concurrent=0
       trainer.micro_batch_tokens=16384 trainer.packing=true launcher.peer_timeout_s=300 task.eval_size=200"
LONG="task=arithmetic_long trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=512 rollout.max_concurrent=0
      trainer.micro_batch_tokens=32768 trainer.packing=true launcher.peer_timeout_s=300 eval.size=200 engine.vllm.max_num_seqs=1024"

if [ "$phase" = main ]; then
  ( step weight_broadcast 110 env CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/weight_broadcast.py --models 1.5b 135m \
        --bucket-mb 1024 256 --reps 5 --out $OUT/weight_broadcast.json
    sed -n '/^{/,/^}/p' $L/weight_broadcast.log >> $S ) &
  BW=$!
  MODEL=$(model); echo "model: $MODEL" | tee -a $S
  # track A, GPUs 0,1: 100 steps with vLLM, then base vs trained with `areal eval` (vLLM, both GPUs)
  ( step train100 330 python3 -m areal_cli.cli train --quiet engine=vllm model=$MODEL $SHORT cluster.gpus=[0,1] \
        run_dir=/tmp/runs/vllm100 trainer.steps=100
    summ vllm100
    step eval 200 python3 -m areal_cli.cli eval models=[$MODEL,/tmp/runs/vllm100/checkpoints/final] task=basic_arithmetic \
        task.eval_size=200 size=200 max_new_tokens=128 engine=vllm engine.vllm.enforce_eager=true gpus=[0,1] \
        max_concurrent=256 out_dir=/tmp/runs/eval100 \
      || step heldout_after 60 python3 benchmarks/device/heldout.py /tmp/runs/vllm100/checkpoints/final task.eval_size=200 eval.size=200 rollout.max_new_tokens=128
    cp /tmp/runs/eval100/eval.md /tmp/runs/eval100/eval.json $OUT/ 2>/dev/null ) &
  TA=$!
  # track B, GPUs 2,3: vLLM in-place updates + logprobs, engine=hf pauses, then one GPU colocated
  wait $BW
  step vllm_check 200 env CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/device/vllm_check.py $MODEL $OUT/vllm_check.json \
       --weight-update inplace && touch /tmp/inplace_ok
  step train_hf 90 $TF python3 -m areal_cli.cli train --quiet engine=hf model=$MODEL $SHORT cluster.gpus=[2,3] \
       run_dir=/tmp/runs/hf12 trainer.steps=12
  summ hf12
  step coloc 130 $TF python3 -m areal_cli.cli train --quiet engine=hf model=$MODEL $SHORT cluster.gpus=[2] \
       run_dir=/tmp/runs/coloc20 trainer.steps=20
  summ coloc20
  wait $TA
  tar czf $OUT/main.tgz --exclude=checkpoints -C /tmp runs s3logs 2>/dev/null
fi
bench() {  # name gpus extra...
  local name=$1 gpus=$2; shift 2
  step $name 560 python3 -m areal_cli.cli bench sync-vs-async engine=vllm model=$(model) $LONG cluster.gpus=$gpus \
       run_dir=/tmp/runs/$name trainer.steps=${STEPS:-20} bench.warmup=3 bench.eta=4 "$@"
  mkdir -p $OUT/$name; cp /tmp/runs/$name/bench.json /tmp/runs/$name/*.png $OUT/$name/ 2>/dev/null; }
if [ "$phase" = bench2 ]; then
  ( bench bench2_reload_abort [0,1] engine.weight_update=reload engine.vllm.pause_mode=abort ) &
  W=$(test -f /tmp/inplace_ok && echo inplace || echo reload)
  bench bench2_${W}_keep [2,3] engine.weight_update=$W engine.vllm.pause_mode=keep
  wait
  (cd /tmp && tar czf $OUT/bench2.tgz --exclude=checkpoints runs/bench2_* s3logs/bench2) 2>/dev/null
fi
if [ "$phase" = bench4 ]; then
  W=$(test -f /tmp/inplace_ok && echo inplace || echo reload)
  bench bench4 [0,1,2,3] engine.weight_update=$W engine.vllm.pause_mode=${PAUSE:-keep} rollout.workers=${GEN:-2} \
        trainer.ranks=${TRAIN:-2} rollout.gpus=${RGPUS:-[0,1]} trainer.gpus=${TGPUS:-[2,3]}
  tar czf $OUT/bench4.tgz --exclude=checkpoints -C /tmp runs/bench4 s3logs/bench4 2>/dev/null
fi
if [ "$phase" = extra ]; then  # vLLM in float32 (logprob agreement), and a 2-GPU run with in-place updates
  MODEL=$(model)
  ( step vllm_check_fp32 240 env CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/device/vllm_check.py $MODEL \
        $OUT/vllm_check_fp32.json --weight-update reload --dtype float32 ) &
  step train_inplace 240 python3 -m areal_cli.cli train --quiet engine=vllm engine.weight_update=inplace model=$MODEL $SHORT \
       cluster.gpus=[2,3] run_dir=/tmp/runs/inplace30 trainer.steps=30
  summ inplace30
  wait
  tar czf $OUT/extra.tgz --exclude=checkpoints -C /tmp runs/inplace30 s3logs/extra 2>/dev/null
fi
if [ "$phase" = coloc ]; then  # one GPU: the colocated run alone (after stage2 with .whl .tf, stage3)
  MODEL=$(model)
  step coloc 200 $TF python3 -m areal_cli.cli train --quiet engine=hf model=$MODEL $SHORT cluster.gpus=[0] \
       run_dir=/tmp/runs/coloc_b trainer.steps=20
  summ coloc_b
fi
echo "done in $(( $(date +%s) - T0 )) s" | tee -a $S
