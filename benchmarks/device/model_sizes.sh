#!/usr/bin/env bash
# Model sizes on a lent 4-GPU machine (nvidia-h100-x4 or nvidia-h200-x4): random-weights checkpoints
# of real architectures (benchmarks/models/, built by benchmarks/random_model.py on the device) run by
# the real `areal train` / `areal bench`, with synthetic response lengths (rollout.length_profile).
# One phase per `run` call, back to back (the machine stays warm ~30 s); every phase builds the
# checkpoint it needs if this machine has none, so each can run alone after the stage phases:
#   stage1   carry .vllm/a            vLLM overlay part 1
#   stage2   carry .vllm/b .whl .tf   vLLM part 2, wheels, transformers 5.24
#   stage3   carry .models/a          default model (its tokenizer) part 1
#   build    carry .models/b          random Qwen2.5-1.5B and Qwen2.5-7B checkpoints (bf16, initialised on GPU 0)
#   buildbw  carry .models/b          build, and meanwhile (GPUs 2, 3) raw NCCL broadcast vs the bucketed path for
#                                     the 7B and 1.5B shapes (benchmarks/weight_broadcast.py -> $OUT/broadcast.json)
#   train7bfit carry .models/b        train7b where a card holds > 100 GiB (H200); on 80 GB cards the same layout
#                                     with bfloat16 AdamW moments (trainer.optim_state=bfloat16), labelled in summary
#   train7b  carry .models/b          7B layout, 2 vLLM workers (GPUs 0, 1) + 2 trainer ranks (GPUs 2, 3),
#                                     10 steps, every response 8192 tokens (length_profile=fixed): MFU, peak memory
#   train7b31 carry .models/b         the same with 1 vLLM worker (GPU 0) + 3 trainer ranks (GPUs 1-3), 12 samples
#                                     per step: less trainer memory per GPU (rank 0 also keeps a bf16 copy of the
#                                     weights for the broadcast, 15 GB at 7B, unless EXTRA has weights.staged=false)
#   tp2      carry .models/b          7B, one vLLM worker with tensor_parallel_size=2 (GPUs 0,1) + 2 trainer ranks,
#                                     6 steps, long-tail lengths (arithmetic_long profile, <= 4096 tokens)
#   dp2      carry .models/b          the same workload with two vLLM workers at TP 1 (GPUs 0, 1)
#   mfu15    carry .models/b          2 GPUs: 1.5B, 1 vLLM worker + 1 trainer rank, 2048-token responses, 6 steps
#   layouts15 carry .models/b         tp2 then dp2 with the 1.5B checkpoint, 5 steps each
#   bench    carry .models/b          areal bench sync-vs-async at the 1.5B size, 2 + 2 GPUs, arithmetic_long profile,
#                                     32 steps per mode (30 measured) and generation alone in the same call
#   bench7   carry .models/b          the same at the 7B size (trainer.optim_state=bfloat16 on 80 GB cards)
#   bench2   carry .models/b          the bench at 1.5B on 2 GPUs: 1 vLLM worker + 1 trainer rank, 8 groups per step
#                                     (PYSPY=1: py-spy stacks of the rollout worker and vLLM's engine process, async
#                                     run and generation alone, $OUT/pyspy_*.txt)
#   lora7b   carry .models/b          7B layout with LoRA rank 16 on 2 GPUs: 1 vLLM worker (GPU 0, LoRA enabled, the
#                                     adapter loaded through vLLM's LoRA API) + ONE trainer rank (GPU 1), 10 steps of
#                                     8192-token responses: peak memory, step time, MFU, the adapter update pause
#   lora7bmerge carry .models/b       the same with engine.lora_merge=true (merged full weights, vLLM's NCCL transfer)
# Phases that need two GPUs run side by side on a 4-GPU machine through pairs.sh (agents@0,1 update7b@2,3).
# Two GPUs (nvidia-h100-x2 / nvidia-h200-x2) are enough for:
#   build7   carry .models/b          the random Qwen2.5-7B checkpoint only (build15: the 1.5B one)
#   update7b carry .models/b          build7, then benchmarks/device/vllm_update.py: raw NCCL vs the in-place path into
#                                     a real vLLM engine (GPU 1) for the 7B bytes, pause while generating, logits check
#   update7btp2 carry .models/b       the same with the engine at tensor_parallel_size=2 (GPUs 1, 2): needs 3 GPUs;
#                                     STAGED_TP=1: engine.vllm.staged_tp (received behind generation at TP 2);
#                                     PAUSE_MODE=keep: engine.vllm.pause_mode=keep (no abort and resubmit in the pause)
#   update7bdp2 carry .models/b       the same with two vLLM workers at TP 1 (GPUs 1, 2; data parallel) updated by one
#                                     broadcast: needs 3 GPUs; raw NCCL from GPU 0 to both in the same call;
#                                     UNSTAGED=1: engine.vllm.staging=false (every update received in the pause);
#                                     NORMAL_PRIO=1: weights.high_priority=false (streams of normal priority)
#   inplace11 carry nothing new       SIZE=1.5b|7b: `areal train` with 1 vLLM worker (GPU 0) + 1 trainer rank (GPU 1),
#                                     engine.weight_update=inplace, long-tail lengths <= 2048: update and pause figures
#                                     (7b: trainer.optim_state=bfloat16, which fits a card of > 100 GiB only)
# On a 2-GPU machine (nvidia-h100-x2; stage1..2 as above, stage2 also carrying .extwhl with peft and pytest).
# A call carries at most 64 MiB with the project's tree (~6 MiB): .vllm/a's 60 MiB part no longer fits beside
# it; split the overlay's two parts again into parts of at most ~44 MiB (same names part00/part01, same SHA256:
# `cat a/*.part00 b/*.part01 | split -b 44M`) and carry each with the wheels or the tree.
#   levers15 carry .models/a          (stage3 and) trainer_profile rows of the 1.5B layout on one GPU each: ROWS0 on
#                                     GPU 0, ROWS1 on GPU 1, at once (an empty ROWSi: that GPU idles, the other has the
#                                     host to itself); PROFILE=ROW: a torch-profiler step of that row
#   long7b   carry nothing more       NGPU GPUs (2), no vLLM: a 7B trainer step of LENGTH-token responses (32768), one
#                                     per rank (SEQS in all), checkpointing every layer / every other layer (EXTRA: bf16 moments)
#   lora2    carry .models/b          tests/engines/test_vllm_lora.py on GPU 1 while the 7B checkpoint builds on GPU 0,
#                                     then lora7bmerge (STEPS, 10) and lora7b (MSTEPS, 3), LEN-token responses
#   agents   carry nothing more       benchmarks/agent_throughput.py (AGENT vs single_turn, engine=vllm, default
#                                     model), then algorithm=cispo on the GPU bench task (CSTEPS steps)
#   judge3   carry nothing more       3 GPUs: a judge on its own GPU beside 1 + 1 (default model), against the
#                                     verifier alone: step time, samples scored/s, the judge's batches and failures
#   judgetest carry nothing more      1 GPU: tests/rewards/test_vllm_judge.py (the vLLM judge against the hf judge)
#   nanprobe carry nothing more       2 GPUs: the 7B LoRA NaN gradient, located (the batch kept and replayed with
#                                     trainer_profile.py --grad-probe), then lora7bmerge on the default checkpoint
#   gradcheck carry nothing more      2 GPUs: the trainer's attention GPU tests, then the default model's engine=vllm run
#                                     (STEPS, 16): every gradient norm finite, the reward's first and last quarter
# Env: PARGS (more trainer_profile.py arguments for levers15 and long7b, e.g. --ragged --arch ...), STEPS (steps of a run), MAXLEN (bench cap, 2048), LEN (LoRA response tokens, 8192), EXTRA (more overrides for every run, e.g. a
# trainer memory option), BUDGET (seconds of the call, 570), BENCH_LIMIT (the bench's own limit, 560: raise it and BUDGET
# for 32 steps at 2 + 2 in a detached sequence); skips: LORATEST=0 (lora2's vLLM test), MSTEPS=0
# (lora2's adapter-path run), AGENT=none (agents' throughput bench), GPUTESTS=0 (gradcheck's tests).
# Results: $OUT/summary.txt, $OUT/<run>.json (size_summary.py), $OUT/<run>_gpu_mem.csv (nvidia-smi every
# 2 s), $OUT/<run>_run.tgz (run directory without checkpoints), bench.json + plots for the bench.
# Every figure is of random weights with synthetic lengths: label it so. Random weights earn reward 0,
# so every advantage is 0: trainer.skip_zero_advantage=false keeps the trainer doing the work it measures.
set -u
phase=${1:?phase}
LOGS=/tmp/mslogs/$phase
source benchmarks/device/common.sh
R=/tmp/rand

ckpt() {  # ARCH DIR [ARGS...]: the random checkpoint $R/DIR of benchmarks/models/ARCH, built once per machine
  if [ ! -f "$R/$2/random_weights.json" ]; then
    local tok; tok=$(model)
    step "build_$2" 300 env CUDA_VISIBLE_DEVICES=$(cvd 0) python3 benchmarks/random_model.py "$1" "$R/$2" --device cuda \
        --tokenizer "$tok" "${@:3}"
  fi
  [ -f "$R/$2/random_weights.json" ] && { echo "checkpoint $R/$2: $(tr -d '\n ' < "$R/$2/random_weights.json")" | tee -a $S; }
}

sized() {  # NAME LIMIT WARMUP OVERRIDES...: one `areal train` with every GPU's memory sampled, then its figures
  local name=$1 t=$2 w=$3; shift 3
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > "$OUT/${name}_gpu_mem.csv" 2>/dev/null &
  local smi=$!
  step "$name" "$t" python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/$name "$@"
  kill $smi 2>/dev/null
  grep -h "^model: \|^weights: \|^lengths: " "$L/$name.log" | tee -a $S
  grep -h "weight updates:" /tmp/runs/$name/logs/rollout-*.log 2>/dev/null | head -2 | tee -a $S
  python3 benchmarks/device/size_summary.py /tmp/runs/$name "$w" "$OUT/${name}_gpu_mem.csv" > "$OUT/$name.json" \
      2>> "$L/$name.log"
  python3 - "$OUT/$name.json" <<'PY' | tee -a $S
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("steps", "step_time_s_median", "mfu_median", "peak_gpu_mem_gb", "nvidia_smi_peak_gib_per_gpu",
        "train_tokens_per_s_median", "gen_tokens_per_s_median", "trained_tokens_per_step_median",
        "weight_sync_s_median", "update_pause_s_median", "update_total_s_median", "update_parts_s_median", "updates",
        "adapter_delta_zero", "weights_unchanged", "probe_logp_change_min", "weight_versions_per_worker", "logp_gap_fresh",
        "skipped_steps", "grad_norm_per_step")
for k in keys:
    print(f"  {k}: {s.get(k)}")
r = s["response_length"]
print(f"  response length p10/p50/p90/max {r['p10']}/{r['p50']}/{r['p90']}/{r['max']} over {r['samples']} samples")
PY
  tar czf "$OUT/${name}_run.tgz" --exclude=checkpoints -C /tmp/runs "$name" 2>/dev/null
}

spy_bench() {  # ASYNC_RUN_DIR: py-spy samples of the bench's async run in its steady state (after SPY_STEPS
               # steps, 8), then of its generation alone (SPY_ALONE_AFTER s after it starts, 45)
  local spy=/tmp/site/bin/py-spy d=$1 pid i
  [ -x $spy ] || spy=/tmp/spy/bin/py-spy  # installed on its own (pip --target leaves an existing bin/ as it is)
  [ -x $spy ] || { echo "py-spy: not installed (carry its wheel with the extra wheels)" | tee -a $S; return; }
  record() {  # PID SECONDS NAME: the process and its children, idle frames kept -> $OUT/pyspy_NAME.txt
    $spy record --subprocesses --idle --threads --nonblocking -p $1 -d $2 -r 100 --format raw \
        -o $OUT/pyspy_$3.txt > $L/pyspy_$3.log 2>&1; }
  for i in $(seq 900); do [ "$(cat $d/metrics.jsonl 2>/dev/null | wc -l)" -ge "${SPY_STEPS:-8}" ] && break; sleep 1; done
  record $(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['rollout-0'])" $d/pids.json) 20 async_rollout
  for i in $(seq 600); do pid=$(pgrep -f "python3 -m areal_cli.bench.alone" | head -1); [ -n "$pid" ] && break; sleep 1; done
  [ -n "$pid" ] || return
  sleep ${SPY_ALONE_AFTER:-45}
  record $pid 12 alone
}

cpu_watch() {  # every 4 s until killed: load, mean CPU clock, the busiest processes (top's second frame)
  while true; do
    { date -u +%T; cat /proc/loadavg; awk '/MHz/ {s += $4; n++} END {if (n) printf "cpu MHz mean %.0f\n", s / n}' /proc/cpuinfo
      top -b -d 2 -n 2 -c -w 160 -o %CPU | awk '/^top -/ {f++} f == 2' | sed -n '7,18p'; } >> "$1"
    sleep 2
  done
}

lora7() {  # PHASE MERGE STEPS LIMIT [OVERRIDES...]: the 7B layout with LoRA, 1 vLLM worker (GPU 0) + ONE trainer
           # rank (GPU 1), every response LEN tokens (8192)
  local ph=$1 merge=$2 n=$3 t=$4 len=${LEN:-8192}; shift 4
  local run=${RUN7/cluster.gpus=\[0,1,2,3\]/cluster.gpus=[0,1]}
  [ -n "${R7:-}" ] && run=${run/model=$R\/qwen2.5-7b /model=$R7 }
  sized ${ph}_$((len / 1024))k "$t" 1 $run rollout.workers=1 trainer.ranks=1 trainer.lora.rank=${RANK:-16} \
      engine.lora_merge=$merge rollout.length_profile=fixed rollout.max_new_tokens=$len \
      engine.vllm.max_model_len=$((len + 1024)) trainer.batch_size=2 rollout.group_size=4 trainer.steps=$n "$@"
}

# the 7B layout on 4 GPUs (generation takes the first GPUs, the trainer the rest); activation checkpointing
# auto (printed in the plan's memory notes): MBT=8704 leaves it off on 141 GB cards at 3 ranks
RUN7="model=$R/qwen2.5-7b engine=vllm cluster.gpus=[0,1,2,3] task=arithmetic_long
      trainer.packing=true trainer.micro_batch_tokens=${MBT:-16384}
      engine.gpu_memory_utilization=0.75 rollout.max_concurrent=0 launcher.peer_timeout_s=600
      launcher.startup_timeout_s=900 eval.at_end=false trainer.skip_zero_advantage=false ${EXTRA:-}"
# tp2 and dp2: one workload, 16 samples per step, long-tail lengths up to 4096 tokens
LONGTAIL="rollout.length_profile=arithmetic_long rollout.max_new_tokens=4096 engine.vllm.max_model_len=5120
          trainer.batch_size=4 rollout.group_size=4 trainer.steps=${STEPS:-6}"

case $phase in
  model) model ;;  # the default model as a Hugging Face directory (pairs.sh converts it before its phases)
  build)
    ckpt qwen2.5-1.5b-instruct qwen2.5-1.5b
    ckpt qwen2.5-7b-instruct qwen2.5-7b ;;
  build7) ckpt qwen2.5-7b-instruct qwen2.5-7b ;;
  build15) ckpt qwen2.5-1.5b-instruct qwen2.5-1.5b ;;
  update7b|update7btp2|update7bdp2)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    tp=1 engines=1; [ "$phase" = update7btp2 ] && tp=2; [ "$phase" = update7bdp2 ] && engines=2
    step $phase 480 python3 benchmarks/device/vllm_update.py $R/qwen2.5-7b --tp $tp --engines $engines --versions ${VERSIONS:-8} \
        ${STAGED_TP:+--staged-tp} ${UNSTAGED:+--unstaged} ${NORMAL_PRIO:+--normal-priority} ${PAUSE_MODE:+--pause-mode $PAUSE_MODE} --out "$OUT/$phase.json" ;;
  inplace11)
    size=${SIZE:-1.5b}
    ckpt qwen2.5-$size-instruct qwen2.5-$size || exit 1
    fit=""; [ "$size" = 7b ] && fit="trainer.optim_state=bfloat16"
    sized inplace11_$size 540 1 model=$R/qwen2.5-$size engine=vllm cluster.gpus=[0,1] rollout.workers=1 trainer.ranks=1 \
        task=arithmetic_long rollout.length_profile=arithmetic_long rollout.max_new_tokens=2048 engine.vllm.max_model_len=3072 \
        trainer.batch_size=8 rollout.group_size=8 trainer.steps=${STEPS:-8} trainer.packing=true \
        trainer.activation_checkpointing=true trainer.micro_batch_tokens=16384 engine.gpu_memory_utilization=0.55 \
        engine.weight_update=inplace rollout.max_concurrent=0 launcher.peer_timeout_s=600 launcher.startup_timeout_s=900 \
        eval.at_end=false trainer.skip_zero_advantage=false $fit ${EXTRA:-}
    grep -h "weights v[0-9]* loaded" /tmp/runs/inplace11_$size/logs/rollout-0.log | tail -n 12 | tee -a $S ;;
  buildbw)
    CUDA_VISIBLE_DEVICES=$(cvd 2 3) setsid timeout 400 python3 benchmarks/weight_broadcast.py --models 7b 1.5b \
        --bucket-mb 1024 --reps 3 --out "$OUT/broadcast.json" > "$L/broadcast.log" 2>&1 &
    bw=$!
    ckpt qwen2.5-1.5b-instruct qwen2.5-1.5b
    ckpt qwen2.5-7b-instruct qwen2.5-7b
    wait $bw; echo "== broadcast rc=$?" | tee -a $S; tail -n 40 "$L/broadcast.log" | tee -a $S ;;
  train7bfit)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    fit=""; [ "$mib" -lt 102400 ] && fit="trainer.optim_state=bfloat16"
    echo "card memory ${mib} MiB; trainer memory option: ${fit:-none (fp32 AdamW moments)}" | tee -a $S
    sized train7b_8k 560 1 $RUN7 $fit rollout.workers=2 trainer.ranks=2 rollout.length_profile=fixed \
        rollout.max_new_tokens=8192 engine.vllm.max_model_len=9216 trainer.batch_size=2 rollout.group_size=4 \
        trainer.steps=${STEPS:-10} ;;
  train7b)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    sized train7b_8k 560 1 $RUN7 rollout.workers=2 trainer.ranks=2 rollout.length_profile=fixed \
        rollout.max_new_tokens=8192 engine.vllm.max_model_len=9216 trainer.batch_size=2 rollout.group_size=4 \
        trainer.steps=${STEPS:-10} ;;
  train7b31)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    sized train7b31_8k 560 1 $RUN7 rollout.workers=1 trainer.ranks=3 rollout.length_profile=fixed \
        rollout.max_new_tokens=8192 engine.vllm.max_model_len=9216 trainer.batch_size=${B:-3} rollout.group_size=4 \
        trainer.steps=${STEPS:-10} ;;
  tp2)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    sized tp2_7b 560 1 $RUN7 $LONGTAIL rollout.workers=1 trainer.ranks=2 engine.vllm.tensor_parallel_size=2 ;;
  dp2)
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    sized dp2_7b 560 1 $RUN7 $LONGTAIL rollout.workers=2 trainer.ranks=2 ;;
  mfu15)  # 2 GPUs: the 1.5B checkpoint, 1 vLLM worker + 1 trainer rank, every response 2048 tokens
    ckpt qwen2.5-1.5b-instruct qwen2.5-1.5b || exit 1
    sized mfu_1.5b 330 1 model=$R/qwen2.5-1.5b engine=vllm cluster.gpus=[0,1] task=arithmetic_long \
        trainer.packing=true trainer.activation_checkpointing=true trainer.micro_batch_tokens=16384 \
        engine.gpu_memory_utilization=0.75 rollout.max_concurrent=0 launcher.peer_timeout_s=600 \
        launcher.startup_timeout_s=900 rollout.length_profile=fixed rollout.max_new_tokens=2048 \
        engine.vllm.max_model_len=3072 trainer.batch_size=8 rollout.group_size=8 trainer.steps=${STEPS:-6} \
        eval.at_end=false trainer.skip_zero_advantage=false ${EXTRA:-} ;;
  layouts15)  # tp2 then dp2 at the 1.5B size (quicker to build), 5 steps each
    ckpt qwen2.5-1.5b-instruct qwen2.5-1.5b || exit 1
    RUN15=${RUN7/qwen2.5-7b/qwen2.5-1.5b}
    sized tp2_1.5b 240 1 $RUN15 $LONGTAIL rollout.workers=1 trainer.ranks=2 engine.vllm.tensor_parallel_size=2 trainer.steps=5
    sized dp2_1.5b 240 1 $RUN15 $LONGTAIL rollout.workers=2 trainer.ranks=2 trainer.steps=5 ;;
  bench|bench7|bench2)  # 2 + 2 GPUs; bench7: the 7B checkpoint (trainer.optim_state=bfloat16 on cards under
    # 100 GiB); bench2: 1.5B on 2 GPUs (1 + 1), 8 groups per step
    size=1.5b; [ "$phase" = bench7 ] && size=7b
    layout="cluster.gpus=[0,1,2,3] rollout.workers=2 trainer.ranks=2 trainer.batch_size=16"
    [ "$phase" = bench2 ] && layout="cluster.gpus=[0,1] rollout.workers=1 trainer.ranks=1 trainer.batch_size=8"
    ckpt qwen2.5-$size-instruct qwen2.5-$size || exit 1
    M=${MAXLEN:-2048}
    fit=""; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "$size" = 7b ] && [ "$mib" -lt 102400 ] && fit="trainer.optim_state=bfloat16"
    # PYSPY=1 (py-spy installed with the extra wheels): where the rollout worker and vLLM's engine process spend
    # their time, 20 s of the async run and 12 s of generation alone (py-spy's raw stacks, idle frames kept)
    [ "${PYSPY:-0}" = 1 ] && spy_bench /tmp/runs/bench_$size/async &
    # every GPU's utilisation each second (generation GPUs in the sync run, the async run and alone)
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
        > "$OUT/bench_gpu_util.csv" 2>/dev/null &
    smi=$!
    cpu_watch "$OUT/bench_cpu.txt" &
    cpuw=$!
    # 2 warm-up + 30 measured steps per mode, then generation alone in the same call
    # TORCH_LOGS=recompiles: why a trainer step still compiled (its metrics' compiled_graphs > 0)
    step bench_$size ${BENCH_LIMIT:-560} env TORCH_LOGS=recompiles python3 -m areal_cli.cli bench sync-vs-async run_dir=/tmp/runs/bench_$size \
        model=$R/qwen2.5-$size engine=vllm $layout \
        task=arithmetic_long rollout.length_profile=arithmetic_long rollout.max_new_tokens=$M \
        engine.vllm.max_model_len=$((M + 1024)) rollout.group_size=8 rollout.max_concurrent=0 \
        engine.vllm.max_num_seqs=1024 engine.gpu_memory_utilization=0.7 engine.vllm.pause_mode=keep trainer.packing=true \
        trainer.micro_batch_tokens=32768 trainer.steps=${STEPS:-32} bench.warmup=2 bench.eta=4 bench.heldout=false \
        trainer.skip_zero_advantage=false engine.vllm.log_stats=true $fit ${EXTRA:-}
    kill $smi $cpuw 2>/dev/null
    cp /tmp/runs/bench_$size/bench.json /tmp/runs/bench_$size/*.png "$OUT"/ 2>/dev/null
    python3 - "$OUT/bench.json" <<'PY' | tee -a $S
import json, sys
b = json.load(open(sys.argv[1]))
print("random weights, synthetic lengths (arithmetic_long profile):")
for k in ("speedup", "step_speedup", "async_vs_ideal", "measurement_error", "ideal_bottleneck",
          "generation_in_system_fraction", "generation_in_system_with_dropped_fraction",
          "generation_in_system_at_load_fraction", "generation_in_system_with_dropped_at_load_fraction",
          "async_running_groups_mean", "split"):
    print(f"  {k}: {b.get(k)}")
for m in ("sync", "async"):
    s = b["modes"][m]
    print(f"  {m}: {s['effective_trained_tokens_per_s']:.0f} trained tokens/s over {s['steps'] - s['warmup_steps']} steps, "
          f"step median {s['step_wall_s_median']:.2f} s, length p50/p90/max {s['response_length']['p50']}/"
          f"{s['response_length']['p90']}/{s['response_length']['max']}, update pause median "
          f"{s['update_pause_s_median']}, weight sync median {s['weight_sync_s_median']}, steps that compiled "
          f"trainer graphs {s.get('compiling_steps')}")
PY
    for m in sync async; do grep -h "compiled the policy's layers" /tmp/runs/bench_$size/$m/logs/trainer-0.log \
        | sed "s/^/$m: /" | tee -a $S; grep -h -A2 "Recompiling function" /tmp/runs/bench_$size/$m/logs/trainer-*.log \
        | grep -v "^--" | sed "s/^.*__recompiles\]//" | head -12 | sed "s/^/$m: /" | tee -a $S; done
    grep -h "weight updates:" /tmp/runs/bench_$size/async/logs/rollout-*.log 2>/dev/null | head -2 | tee -a $S
    # what the worker saw finish against what vLLM counted (running / waiting requests, generation tokens/s)
    for m in sync async; do grep -h "generation: \|Avg generation throughput" \
        /tmp/runs/bench_$size/$m/logs/rollout-0.log 2>/dev/null | tail -n 8 | sed "s/^/$m: /" | tee -a $S; done
    python3 -c "import json, sys; print('generation alone:', json.load(open(sys.argv[1]))['standalone']['generation_alone'])" \
        "$OUT/bench.json" | tee -a $S
    tar czf "$OUT/bench_runs.tgz" --exclude=checkpoints -C /tmp/runs bench_$size 2>/dev/null ;;
  lora7b|lora7bmerge)  # 1 generation + 1 training GPU; the full fine-tuning figures are train7b's and train7b31's
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    merge=false; [ "$phase" = lora7bmerge ] && merge=true
    lora7 $phase $merge ${STEPS:-10} 560 ;;
  levers15)  # 2 GPUs, no vLLM, no model needed: trainer_profile rows of the 1.5B layout (8 x 8k tokens), ROWS0 on
             # GPU 0 and ROWS1 on GPU 1 at once -> $OUT/levers_gpu{0,1}/results.json
    step build_1.5b 120 env CUDA_VISIBLE_DEVICES=$(cvd 0) python3 -c \
        "from benchmarks.trainer_variants import checkpoint; print(checkpoint('qwen2.5-1.5b-instruct'))"
    # a GPU whose ROWS is empty runs nothing; two at once split the host's cores (each process would take
    # them all, and the host's share of a step grows)
    threads=$(nproc); [ -n "${ROWS0:-}" ] && [ -n "${ROWS1:-}" ] && threads=$((threads / 2))
    for g in 0 1; do
      rows=ROWS$g
      [ -n "${!rows:-}" ] || continue
      step levers_gpu$g ${LIMIT:-300} env CUDA_VISIBLE_DEVICES=$(cvd $g) OMP_NUM_THREADS=$threads \
          python3 -m benchmarks.trainer_profile --steps ${STEPS:-3} --profile ${PROFILE:-} --out "$OUT/levers_gpu$g" ${PARGS:-} \
          --rows ${!rows} &
    done
    wait
    for g in 0 1; do grep -h "step .* MFU" "$L/levers_gpu$g.log" 2>/dev/null | tee -a $S; done ;;
  long7b)  # NGPU GPUs (2), no vLLM: the 7B layout's trainer step with LENGTH-token responses (32768), one
            # sequence per rank, activation checkpointing, through torchrun -> $OUT/long7b/results.json
    n=${NGPU:-2}
    step build_7b 300 env CUDA_VISIBLE_DEVICES=$(cvd 0) python3 -c \
        "from benchmarks.trainer_variants import checkpoint; print(checkpoint('qwen2.5-7b-instruct'))"
    mbt=$(( ${LENGTH:-32768} + 128 ))
    step long7b ${LIMIT:-420} env CUDA_VISIBLE_DEVICES=$(cvd $(seq -s ' ' 0 $((n - 1)))) python3 -m torch.distributed.run \
        --nproc-per-node $n -m benchmarks.trainer_profile --arch qwen2.5-7b-instruct --seqs ${SEQS:-$(( n < 2 ? 2 : n ))} \
        --length ${LENGTH:-32768} ${PARGS:-} \
        --steps ${STEPS:-2} --profile --out "$OUT/long7b" --rows ${ROWS:-baseline+mbt$mbt every2+mbt$mbt} \
        -- ${EXTRA:-trainer.optim_state=bfloat16}
    grep -h "step .* MFU\|out of memory" "$L/long7b.log" | tee -a $S ;;
  lora2)  # 2 GPUs: vLLM's LoRA path on the tiny model (tests/engines/test_vllm_lora.py, GPU 1) while the 7B
          # checkpoint builds (GPU 0); then lora7bmerge (STEPS, the default path with vLLM) and lora7b (MSTEPS)
    m=$(model)
    # -s -v: vLLM's own output and each test's name reach the log as they happen (a test stopped at its limit
    # prints no report)
    [ "${LORATEST:-1}" = 0 ] || step lora_vllm_test ${TLIMIT:-180} env CUDA_VISIBLE_DEVICES=$(cvd 1) python3 -m pytest -s -v -p no:cacheprovider \
        tests/engines/test_vllm_lora.py -x -rs &
    ckpt qwen2.5-7b-instruct qwen2.5-7b
    wait
    lora7 lora7bmerge true ${STEPS:-10} ${LIMIT:-270}
    [ "${MSTEPS:-3}" = 0 ] || lora7 lora7b false ${MSTEPS:-3} ${MLIMIT:-150} ;;
  agents)  # 2 GPUs, the default model: the agent endpoint against single_turn (benchmarks/agent_throughput.py),
           # then algorithm=cispo on the GPU bench task (B = 32 x G = 8, <= 128 tokens)
    m=$(model)
    GB="engine=vllm model=$m cluster.gpus=[0,1] rollout.max_new_tokens=128 rollout.max_concurrent=0
        trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300"
    [ "${AGENT:-}" = none ] || step agent_bench ${LIMIT:-150} python3 -m benchmarks.agent_throughput --steps ${STEPS:-8} --warmup 2 --batch 32 \
        --group 8 --out /tmp/runs/agent_bench --agent ${AGENT:-examples.agents.plan_then_answer:run} \
        workflow.max_turns=2 $GB
    cp /tmp/runs/agent_bench/agent_throughput.json "$OUT"/ 2>/dev/null
    step cispo ${CLIMIT:-120} python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/cispo $GB algorithm=cispo \
        trainer.batch_size=32 rollout.group_size=8 trainer.steps=${CSTEPS:-20} eval.at_end=false
    python3 benchmarks/device/run_summary.py /tmp/runs/cispo 2 > "$OUT/cispo_summary.json" 2>> "$L/cispo.log"
    head -c 1500 "$OUT/cispo_summary.json" | tee -a $S
    tar czf "$OUT/agents_runs.tgz" --exclude=checkpoints -C /tmp/runs agent_bench cispo 2>/dev/null ;;
  judge3)  # 3 GPUs, the default model: the judge on its own GPU (reward.gpus=[2], the policy's initial weights,
           # frozen, served by vLLM) beside 1 vLLM worker (GPU 0) + 1 trainer rank (GPU 1), against the same run
           # with the verifier alone
    m=$(model)
    b=32 g=8
    J="engine=vllm model=$m cluster.gpus=[0,1] rollout.max_new_tokens=128 rollout.max_concurrent=0
       trainer.batch_size=$b rollout.group_size=$g trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300
       trainer.steps=${STEPS:-12} eval.at_end=false"
    step verifier ${LIMIT:-200} python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/verifier $J
    step judge ${LIMIT:-260} python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/judge $J \
        "reward.fn=[auto,judge]" "reward.weights=[1,1]" "reward.gpus=[2]" reward.judge.engine=vllm
    for r in verifier judge; do
      python3 benchmarks/device/run_summary.py /tmp/runs/$r 2 > "$OUT/${r}_summary.json" 2>> "$L/$r.log"; done
    python3 - "$OUT" /tmp/runs/judge/metrics.jsonl $((b * g)) <<'PY' | tee -a $S
import json, statistics, sys
for r in ("verifier", "judge"):
    s = json.load(open(f"{sys.argv[1]}/{r}_summary.json"))
    n = s["steps"] - s["warmup_steps"]
    print(f"{r}: step median {s['step_wall_s_median']:.2f} s, {s['effective_trained_tokens_per_s']:.0f} trained tokens/s, "
          f"{int(sys.argv[3]) * n / s['window_s']:.1f} samples scored/s over {n} steps, reward {s['reward_first_quarter']:.3f} -> "
          f"{s['reward_last_quarter']:.3f}")
rows = [json.loads(x) for x in open(sys.argv[2])]
for k in ("reward_judge_mean", "reward_judge_batch_mean", "reward_judge_batch_workers_max", "reward_judge_parse_error",
          "reward_judge_timeout", "reward_judge_error"):
    v = [row[k] for row in rows if k in row]
    print(f"  {k}: median {statistics.median(v) if v else None} over {len(v)} steps")
PY
    tar czf "$OUT/judge_runs.tgz" --exclude=checkpoints -C /tmp/runs verifier judge 2>/dev/null ;;
  gradcheck)  # 2 GPUs, the default model: the trainer's attention GPU tests (GPU 1) while nothing else runs, then
              # engine=vllm 1 + 1 for STEPS (16) steps of B = 32 x G = 8: every gradient norm must be finite and the
              # reward should rise (the cuDNN attention fault skipped every step after the first); EXTRA is added
              # (e.g. trainer.detect_anomaly=true to name the operation where a NaN starts)
    m=$(model)
    [ "${GPUTESTS:-1}" = 0 ] || step attention_gpu_tests ${TLIMIT:-120} env CUDA_VISIBLE_DEVICES=$(cvd 1) python3 -m pytest -q -p no:cacheprovider \
        tests/trainer/test_cudnn_sdpa.py tests/trainer/test_varlen.py -rs
    step gradcheck ${LIMIT:-300} python3 -m areal_cli.cli train --quiet run_dir=/tmp/runs/gradcheck engine=vllm model=$m \
        cluster.gpus=[0,1] rollout.max_new_tokens=128 rollout.max_concurrent=0 trainer.batch_size=32 rollout.group_size=8 \
        trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300 trainer.steps=${STEPS:-16} eval.at_end=false ${EXTRA:-}
    python3 - /tmp/runs/gradcheck/metrics.jsonl <<'PY' | tee -a $S
import json, math, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
norms = [r.get("grad_norm") for r in rows]
bad = [r["step"] for r in rows if not isinstance(r.get("grad_norm"), float) or not math.isfinite(r["grad_norm"])]
q = max(1, len(rows) // 4)
first, last = (sum(r["reward_mean"] for r in part) / len(part) for part in (rows[:q], rows[-q:]))
print(f"gradcheck: {len(rows)} steps, non-finite gradient norms at steps {bad or 'none'}, reward {first:.3f} -> {last:.3f}")
print("  grad norms: " + ", ".join(f"{g:.3g}" if isinstance(g, float) else str(g) for g in norms))
PY
    tar czf "$OUT/gradcheck_run.tgz" --exclude=checkpoints -C /tmp/runs gradcheck 2>/dev/null ;;
  nanprobe)  # 2 GPUs: where a 7B LoRA run's NaN gradient starts. With the checkpoint built as before
             # (--keep-zero-pad-row: the pad token's embedding row all zero), one step of lora7bmerge (LEN 4096,
             # entropy bonus) keeps its batch (RUN_DIR/nonfinite/), replayed on GPU 1 by trainer_profile.py
             # --grad-probe (each layer's largest output gradient, its token and input RMS); then lora7bmerge
             # (STEPS, 10) with the default checkpoint (no zero row) and the same entropy bonus
    ckpt qwen2.5-7b-instruct qwen2.5-7b-padrow --keep-zero-pad-row || exit 1
    python3 - $R/qwen2.5-7b-padrow <<'PY' | tee -a $S
import glob, sys
from safetensors import safe_open
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with safe_open(f, "pt", device="cuda") as h:
        for k in h.keys():
            if "embed" in k or "lm_head" in k:
                n = h.get_tensor(k).float().norm(dim=1)
                z = (n == 0).nonzero().flatten().tolist()
                print(f"{k}: {len(z)} all-zero rows {z[:20]}, row norm median {float(n.median()):.3g}")
PY
    ENT="trainer.lr=2e-4 algorithm.entropy_coef=1.0"
    LEN=${LEN:-4096} R7=$R/qwen2.5-7b-padrow lora7 nanprobe true 1 240 $ENT trainer.max_nonfinite_steps=0
    grep -h "embedding row" /tmp/runs/nanprobe_*k/logs/trainer-0.log 2>/dev/null | head -2 | tee -a $S
    kept=$(ls /tmp/runs/nanprobe_*k/nonfinite/batch_*.msgpack 2>/dev/null | head -1)
    if [ -n "$kept" ]; then
      cp "$kept" "$OUT/"
      step replay 240 env CUDA_VISIBLE_DEVICES=$(cvd 1) python3 -m benchmarks.trainer_profile --arch $R/qwen2.5-7b-padrow \
          --batch "$kept" --grad-probe --steps 1 --profile --out $OUT/replay --rows baseline+lora16+entropy
      grep -h "^layer\|gradient of each" $L/replay.log | tee -a $S
    else echo "nanprobe: no batch kept (every gradient norm finite)" | tee -a $S; fi
    ckpt qwen2.5-7b-instruct qwen2.5-7b || exit 1
    LEN=${LEN:-4096} lora7 lora7bmerge true ${STEPS:-10} ${LIMIT:-300} $ENT ;;
  judgetest)  # 1 GPU: the vLLM judge against the hf judge on the default model (tests/rewards/test_vllm_judge.py)
    # the default model's HF directory (the test finds it by its alias), converted before the test's clock starts
    python3 -c "from areal_cli.model_source import resolve_model; resolve_model('smollm2-135m-instruct')" 2> $L/convert.log
    step judge_vllm_test ${LIMIT:-240} env CUDA_VISIBLE_DEVICES=$(cvd 0) python3 -m pytest -s -v -p no:cacheprovider \
        tests/rewards/test_vllm_judge.py -x -rs ;;
  *) echo "unknown phase $phase (stage1 stage2 stage3 model build build7 build15 update7b update7btp2 update7bdp2 inplace11 bench bench7 bench2 train7b train7b31 tp2 dp2 lora7b lora7bmerge levers15 long7b lora2 agents judge3 judgetest gradcheck nanprobe)"; exit 2 ;;
esac
tar czf "$OUT/${phase}_logs.tgz" -C /tmp mslogs 2>/dev/null
echo "== done ($phase, $(date -u +%T))" | tee -a $S
