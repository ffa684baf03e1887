#!/usr/bin/env bash
# One GPU, the trainer and the engine on the same card (weights through CUDA IPC), on a lent
# 1-GPU machine; one phase per `run` call, the calls back to back (the machine stays warm ~30 s):
# (a call carries at most 64 MiB with the tree, ~8 MiB: split the vLLM overlay 48 + 28 MiB; .tf
# (13 MiB) travels with stage_moe, or with stage2 where the tree leaves the room)
#   stage1  carry .vllm/a                    vLLM overlay, part 1
#   stage2  carry .vllm/b .whl .extwhl       vLLM part 2, wheels, peft, pytest (.extwhl: peft, pytest,
#                                            lm-format-enforcer + interegular, which vLLM's
#                                            structured-output check imports; py-spy)
#   stage3  carry .models/a                  model part 1
#   check   carry .models/b                  model part 2; the GPU tests (tests/gpu: the IPC
#                                            broadcast, compiled vs eager logprobs against float32,
#                                            a short run of each engine on one GPU; RUNS=0: no runs)
#   staleness  carry .models/b               (after stage3, instead of check) the IPC test; the
#                                            default engine on one GPU at rollout.max_staleness=1,
#                                            8 and 16 groups a step
#   contention carry .models/b           (after stage3) the default model's trainer step (trainer_profile.py,
#                                        the run's shape) alone, then beside a steady vLLM decode load on
#                                        the same card (vllm_load.py), with FSDP and without (trainer.shard);
#                                        the same under CUDA MPS where the machine has its control daemon
#   agents  (nothing carried)                agent_throughput.py: workflow=agent against single_turn on
#                                            cluster.gpus=[0] with vLLM, for each of AGENTS (the bench's
#                                            one_call, the same call as single_turn; then plan_then_answer),
#                                            one call; py-spy of each run's rollout worker (PYSPY=0: not)
#   bench15 (nothing more; MODES=async, then MODES=sync, then the same again) the random-weights
#                                            Qwen2.5-1.5B layout (built here once) on cluster.gpus=[0]:
#                                            areal bench sync-vs-async, arithmetic_long lengths <= 2048,
#                                            32 steps a mode (30 measured), one mode per call (a fresh
#                                            machine's first start costs ~5 min, then ~45 s); the third
#                                            call, both modes kept, measures generation alone and compares
#   alternate (nothing carried)              the GPU test of cluster.share=alternate (vLLM sleeps
#                                            while the trainer steps; ALT=0: not), then the constrained-decoding test
#   seven   (nothing carried; MODE=lora, then MODE=full) the random-weights Qwen2.5-7B layout on
#                                            cluster.gpus=[0]: LoRA rank 16 concurrent, 10 steps; full
#                                            fine-tuning in the mode that fits, 5 steps; peak memory per process
#   stage_moe  carry .vllm/moe .tf           (after stage1-2) vLLM's MoE kernels into the overlay
#                                            (benchmarks/device/build_moe_kernels.sh builds .vllm/moe)
#   moe     (after stage_moe and the model; nothing carried) a random-weights MoE of a real layout
#           (ARCH: olmoe-1b-7b-0924 or qwen3-30b-a3b, LAYERS of its decoder layers, 4 by default; built
#           here once) on cluster.gpus=GPUS ([0]) with vLLM: STEPS (10) steps, engine.weight_update=UPDATE
#           (auto); MFU, the router's loss, each update's pause, each process's peak GPU memory; TFRUN=1:
#           under transformers 5.24; BUILD_ONLY=1: build the checkpoint and stop (a call of its own for large layouts);
#           first tests/gpu/test_vllm_moe.py (TESTS=0: not; TESTS_K=mixtral: those cases only); each process's peak GPU memory and the
#           host's used memory. The OLMoE-1B-7B layout whole (16 layers, 6.9B) fully fine-tuned on one GPU:
#           LAYERS=16 EXTRA="trainer.optim_state=bfloat16" (the plan computed on the CPU for a 140 GiB card:
#           alternate, the trainer ~89 GiB without checkpointing while vLLM sleeps; float32 moments do not
#           fit beside vLLM awake at an update, and the plan refuses them with the fixes).
#           The same layout with LoRA on attention and every routed expert, concurrent:
#           LAYERS=16 EXTRA="trainer.lora.rank=16 trainer.lora.target_experts=true".
#           The Qwen3-30B-A3B layout whole with LoRA on one GPU, concurrent (the
#           plan without either staging copy: vLLM 69.9 GiB, the trainer ~66 GiB checkpointing every
#           layer; the 57 GiB checkpoint in RAM, as the disk lacks the room beside the stage):
#           first BUILD_ONLY=1 MOE_DIR=/dev/shm/rand TESTS=0 ARCH=qwen3-30b-a3b LAYERS=48 (a call: ~180 s),
#           then MOE_DIR=/dev/shm/rand TESTS=0 ARCH=qwen3-30b-a3b LAYERS=48 STEPS=5 LIMIT=565 BUDGET=590
#           EXTRA="trainer.lora.rank=16 eval.at_end=false weights.staged=false engine.vllm.staging=false
#           engine.gpu_memory_utilization=0.46 trainer.activation_checkpointing=true
#           trainer.lora.merged_checkpoint=false" (the trainer held 67.1 GiB before its first step
#           beside vLLM's 65.6 GiB at 0.5: 0.46 leaves vLLM ~3 GiB of KV cache and the trainer ~5 GiB
#           more; with the staging copies the plan is alternate, and vLLM asleep keeps its 57 GiB in
#           host memory: then not beside a checkpoint in RAM; the merged final checkpoint, 61 GB,
#           fits neither the disk beside the stage nor the RAM beside the checkpoint: the adapter alone)
#   moegap  (after stage_moe and the model)  the moe run with algorithm.routing_replay=true, then false
#                                            (STEPS 8 each, no closing evaluation): logp_gap_fresh of each;
#                                            MOE_FROM=moefy: the default model as an MoE of its own
#                                            neurons (benchmarks/moefy.py) on the default task
#   cpu     (carry .tf; after stage3)        the CPU path on this host's processor pinned to 2 cores, no GPU:
#                                            dtype auto (bfloat16 where native) then float32, STEPS (4) each
#   pair    (nothing carried)                the default model, 50 steps + closing evaluation on
#                                            cluster.gpus=[0], engine=vllm then engine=hf
#   pausemode (nothing carried; PAUSES, default "keep abort") the default model, 50 steps + closing
#                                            evaluation on cluster.gpus=[0] with vLLM, once per
#                                            engine.vllm.pause_mode: the learning and the pause of each
# Results: $OUT/summary.txt, the runs' summaries and logs.
set -u
phase=${1:?phase}
BUDGET=${BUDGET:-590}
source benchmarks/device/common.sh
MODEL=$(model)
echo "model: $MODEL" | tee -a $S
peaks() {  # CSV of nvidia-smi's compute apps (timestamp, pid, MiB) -> each process's peak
  python3 - "$1" <<'PY' | tee -a $S
import collections, sys
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 3 and parts[2].isdigit():
        peak[parts[1]] = max(peak[parts[1]], int(parts[2]))
for pid, mib in sorted(peak.items(), key=lambda kv: -kv[1]):
    print(f"peak GPU memory of pid {pid}: {mib / 1024:.1f} GiB")
PY
}
moe_model() {  # R: the random-weights MoE of ARCH cut to LAYERS layers, built here once (moe, moegap)
  A=${ARCH:-olmoe-1b-7b-0924}; N=${LAYERS:-4}; R=${MOE_DIR:-/tmp/rand}/$A-$N
  [ -f /tmp/vsite/.moe_done ] || { echo "no MoE kernels: run stage_moe first" | tee -a $S; exit 2; }
  [ -f $R/random_weights.json ] || step build_moe 300 python3 benchmarks/random_model.py $A $R \
      --device cuda --tokenizer $MODEL --layers $N; }
# the MoE runs' shape: arithmetic_long lengths <= 512, B = 8 x G = 8, every row trained
MOE_SHAPE="trainer.batch_size=8 rollout.group_size=8 task=arithmetic_long rollout.length_profile=arithmetic_long
  rollout.max_new_tokens=512 engine.vllm.max_model_len=1024 trainer.skip_zero_advantage=false
  launcher.peer_timeout_s=600"
case $phase in
  check)
    TAIL=25 step gpu_ipc 150 $TF python3 -m pytest -q -p no:cacheprovider tests/gpu/test_ipc_weights.py
    TAIL=8 step gpu_compiled 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_compiled_logprobs.py
    [ "${RUNS:-1}" = 0 ] && { cp -r $L $OUT/logs-$phase 2>/dev/null; cat $S; exit 0; }  # RUNS=0: the tests alone
    TAIL=40 step gpu_vllm_run 300 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_one_gpu_run.py -k vllm
    TAIL=40 step gpu_hf_run 120 $TF python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_one_gpu_run.py -k hf
    ;;
  alternate)
    # cluster.share=alternate on one GPU: vLLM sleeps through each step (the GPU test)
    [ "${ALT:-1}" = 1 ] && TAIL=30 step gpu_alternate 300 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_one_gpu_run.py -k alternate
    # grammar-constrained decoding through vLLM's structured outputs (workflow.constrained_tokens)
    # (each engine under the transformers it runs with: the image's for vLLM, 5.24 for hf)
    TAIL=15 step gpu_constrained_vllm 150 python3 -m pytest -q -x -p no:cacheprovider \
        tests/gpu/test_constrained_decoding.py -k vllm
    TAIL=15 step gpu_constrained_hf 120 $TF python3 -m pytest -q -x -p no:cacheprovider \
        tests/gpu/test_constrained_decoding.py -k hf
    ;;
  seven)
    # the Qwen2.5-7B layout (random weights, built here once) on cluster.gpus=[0]: MODE=lora (rank 16,
    # concurrent, 10 steps) or MODE=full (every weight, bfloat16 Adam moments, cluster.share auto:
    # alternate where the trainer fits only while vLLM sleeps, 5 steps); each process's peak GPU
    # memory from nvidia-smi every second
    R=/tmp/rand/qwen2.5-7b
    [ -f $R/random_weights.json ] || step build7 300 python3 benchmarks/random_model.py qwen2.5-7b-instruct $R \
        --device cuda --tokenizer $MODEL
    nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader,nounits -l 1 \
        > $OUT/seven_${MODE:-lora}_apps.csv 2>/dev/null &
    smi=$!
    case ${MODE:-lora} in
      lora) M="trainer.lora.rank=16 trainer.steps=10" ;;
      full) M="trainer.optim_state=bfloat16 trainer.steps=5" ;;
    esac
    TAIL=30 step seven_${MODE:-lora} ${LIMIT:-560} python3 -m areal_cli.cli train model=$R cluster.gpus=[0] \
        engine=vllm trainer.batch_size=8 rollout.group_size=8 task=arithmetic_long \
        rollout.length_profile=arithmetic_long rollout.max_new_tokens=1024 engine.vllm.max_model_len=2048 \
        trainer.skip_zero_advantage=false launcher.peer_timeout_s=600 $M run_dir=/tmp/runs/seven_${MODE:-lora} ${EXTRA:-}
    kill $smi 2>/dev/null
    peaks $OUT/seven_${MODE:-lora}_apps.csv
    step seven_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/seven_${MODE:-lora} 2
    tar czf $OUT/seven_${MODE:-lora}.tgz -C /tmp/runs --exclude=checkpoints seven_${MODE:-lora} 2>/dev/null
    ;;
  moe)
    [ -f /tmp/vsite/.moe_done ] || { echo "no MoE kernels: run stage_moe first" | tee -a $S; exit 2; }
    # the in-place MoE loading against vLLM's own loader, and the routed experts (TESTS=0: skipped)
    [ "${TESTS:-1}" = 1 ] && TAIL=30 step gpu_moe 300 python3 -m pytest -q -x -p no:cacheprovider \
        tests/gpu/test_vllm_moe.py ${TESTS_K:+-k "$TESTS_K"}
    moe_model; RUN=moe_$A-$N
    [ "${BUILD_ONLY:-0}" = 1 ] && { du -sh $R | tee -a $S; free -g | tee -a $S; exit 0; }  # the checkpoint alone
    P=""; [ "${TFRUN:-0}" = 1 ] && P=$TF
    nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader,nounits -l 1 \
        > $OUT/${RUN}_apps.csv 2>/dev/null &
    smi=$!
    (while true; do free -m | awk 'NR==2{print $3}' >> $OUT/${RUN}_host_mib.txt; sleep 2; done) &
    hostmem=$!
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 \
        > $OUT/${RUN}_gpu_util.csv 2>/dev/null &
    util=$!
    # SPY=1: every 60 s from 150 s on, py-spy's stacks of the run's processes (where a slow step sits)
    spyloop=""
    if [ "${SPY:-1}" = 1 ] && [ -x /tmp/spy/bin/py-spy ]; then
      (sleep 150; while true; do
         for pid in $(pgrep -f "areal_cli" ); do
           { echo "== $(date +%T) pid $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-120)"
             timeout 20 /tmp/spy/bin/py-spy dump --pid $pid 2>&1 | head -n 60; } >> $OUT/${RUN}_spy.txt
         done; sleep 60; done) &
      spyloop=$!
    fi
    TAIL=30 step $RUN ${LIMIT:-480} $P python3 -m areal_cli.cli train model=$R cluster.gpus=${GPUS:-[0]} \
        engine=vllm engine.weight_update=${UPDATE:-auto} trainer.steps=${STEPS:-10} $MOE_SHAPE \
        run_dir=/tmp/runs/$RUN ${EXTRA:-}
    kill $smi $hostmem $util $spyloop 2>/dev/null
    peaks $OUT/${RUN}_apps.csv
    awk -F', ' '{gsub(/ %/,"",$2); n++; s+=$2; if ($2>0) b++} END {if (n) printf "GPU utilization: mean %.0f%%, busy in %d of %d samples (5 s)\n", s/n, b, n}' \
        $OUT/${RUN}_gpu_util.csv | tee -a $S
    echo "host memory used, peak: $(sort -n $OUT/${RUN}_host_mib.txt | tail -n 1) MiB" | tee -a $S
    grep -h -i -E "weight updates:|moe|expert" /tmp/runs/$RUN/logs/rollout*.log 2>/dev/null | head -n 8 | tee -a $S
    python3 - /tmp/runs/$RUN <<'PY' | tee -a $S
import json, pathlib, statistics, sys
run = pathlib.Path(sys.argv[1])
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
ups = [json.loads(x) for p in run.glob("**/weight_updates*.jsonl") for x in p.read_text().splitlines() if x.strip()]
med = lambda xs: statistics.median(xs) if xs else None
print("steps", len(rows), "mfu median (after 2)", med([r["mfu"] for r in rows[2:] if "mfu" in r]),
      "router_aux_loss last", rows[-1].get("router_aux_loss") if rows else None)
print("update pause_total_s median", med([u["pause_total_s"] for u in ups if "pause_total_s" in u]),
      "pause_s median", med([u["pause_s"] for u in ups if "pause_s" in u]),
      "weight_sync_s median", med([r["weight_sync_s"] for r in rows if "weight_sync_s" in r]))
PY
    step ${RUN}_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/$RUN 2
    tar czf $OUT/$RUN.tgz -C /tmp/runs --exclude=checkpoints $RUN 2>/dev/null
    ;;
  moegap)
    # the behaviour-vs-trainer logprob gap with routing replay and without, the same MoE run
    # otherwise (after stage_moe and the model; ARCH, LAYERS as for moe; STEPS 8 each).
    # MOE_FROM=moefy: instead of random weights, the default model made a Mixtral-layout MoE of its
    # own MLP neurons (benchmarks/moefy.py, 7 of 8 experts a token), on the default task
    if [ "${MOE_FROM:-}" = moefy ]; then
      R=/tmp/moefied
      [ -f $R/moefied.json ] || TAIL=20 step moefy 300 $TF python3 benchmarks/moefy.py $R --model $MODEL --device cuda
      # every row trained (groups of one reward would be skipped, and with them the gap's tokens),
      # synchronous so that every row is fresh, as in the CPU comparison (BENCHMARKS.md)
      MOE_SHAPE="launcher.peer_timeout_s=600 trainer.skip_zero_advantage=false rollout.max_staleness=0"
    else
      moe_model
    fi
    # (the replayed run also measures, on the same tokens, the gap without replay and the flips:
    # algorithm.routing_probe)
    for rr in true false; do
      TAIL=6 step gap_$rr ${LIMIT:-240} python3 -m areal_cli.cli train model=$R cluster.gpus=[0] \
          engine=vllm trainer.steps=${STEPS:-8} algorithm.routing_replay=$rr \
          algorithm.routing_probe=$rr eval.at_end=false \
          $MOE_SHAPE run_dir=/tmp/runs/gap_$rr ${EXTRA:-}
      python3 - /tmp/runs/gap_$rr $rr <<'PY' | tee -a $S
import json, pathlib, statistics, sys
rows = [json.loads(x) for x in (pathlib.Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines() if x.strip()]
for key in ("logp_gap_fresh", "logp_gap_fresh_free", "routing_flip_fraction"):
    v = [r[key] for r in rows if key in r]
    if v:
        print(f"routing_replay={sys.argv[2]}: steps {len(rows)}, {key} median {statistics.median(v):.4g}"
              f" mean {statistics.fmean(v):.4g} (n={len(v)}): {[round(g, 4) for g in v]}")
PY
      tar czf $OUT/gap_$rr.tgz -C /tmp/runs --exclude=checkpoints gap_$rr 2>/dev/null
    done
    ;;
  cpu)
    # the first run's CPU path on this machine's processor (native bfloat16 where it has AMX or
    # AVX512_BF16), 2 cores as on the 2-core machines, no GPU: dtype auto (what it resolves to is
    # printed), then float32; STEPS (4) steps each, the default model and task, no evaluation
    # (EVAL=true: the closing one; STEPS=30 EVAL=true DTYPES=auto: the first run, `make train`'s)
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $S
    [ -d /tmp/tf524/transformers ] || tf_install
    grep -o -w -E "amx_bf16|amx_tile|avx512_bf16|avx512f|avx2" /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a $S; echo | tee -a $S
    for d in ${DTYPES:-auto float32}; do
      D=""; [ $d = float32 ] && D="trainer.dtype=float32 engine.dtype=float32 weights.dtype=float32"
      # engine=hf: under transformers 5.24 ($TF; the image's older one fails in its attention)
      TAIL=12 step cpu_$d ${LIMIT:-270} $TF env CUDA_VISIBLE_DEVICES= taskset -c 0,1 python3 -m areal_cli.cli \
          train model=$MODEL trainer.steps=${STEPS:-4} eval.at_end=${EVAL:-false} launcher.peer_timeout_s=300 \
          run_dir=/tmp/runs/cpu_$d $D
      grep -h -E "^dtype|tok/s" $L/cpu_$d.log | head -n 8 | tee -a $S
      tar czf $OUT/cpu_$d.tgz -C /tmp/runs --exclude=checkpoints cpu_$d 2>/dev/null
    done
    ;;
  pair)
    # each engine with what a one-GPU run of it defaults to, unless B (groups a step) is given
    RUN="model=$MODEL cluster.gpus=[0] trainer.steps=${STEPS:-50} ${B:+trainer.batch_size=$B} launcher.peer_timeout_s=300"
    TAIL=20 step vllm50 ${VLLM_LIMIT:-240} python3 -m areal_cli.cli train $RUN engine=vllm \
        run_dir=/tmp/runs/vllm50
    step vllm50_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/vllm50 2
    TAIL=20 step hf50 ${HF_LIMIT:-330} $TF python3 -m areal_cli.cli train $RUN engine=hf run_dir=/tmp/runs/hf50
    step hf50_summary 30 $TF python3 benchmarks/device/run_summary.py /tmp/runs/hf50 2
    for r in vllm50 hf50; do
      [ -d /tmp/runs/$r ] && tar czf $OUT/$r.tgz -C /tmp/runs --exclude=checkpoints $r
    done
    ;;
  pausemode)
    for m in ${PAUSES:-keep abort}; do
      TAIL=8 step pause_$m ${PAUSE_LIMIT:-280} python3 -m areal_cli.cli train model=$MODEL cluster.gpus=[0] \
          engine=vllm engine.vllm.pause_mode=$m trainer.steps=${STEPS:-50} launcher.peer_timeout_s=300 \
          run_dir=/tmp/runs/pause_$m ${EXTRA:-}
      step pause_${m}_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/pause_$m 2
      [ -d /tmp/runs/pause_$m ] && tar czf $OUT/pause_$m.tgz -C /tmp/runs --exclude=checkpoints pause_$m
    done
    ;;
  staleness)
    # the IPC test, then the default engine (vLLM, none named) at staleness 1 with 8 and 16 groups a step
    TAIL=6 step gpu_ipc 150 $TF python3 -m pytest -q -p no:cacheprovider tests/gpu/test_ipc_weights.py
    RUN="model=$MODEL cluster.gpus=[0] trainer.steps=${STEPS:-50} rollout.max_staleness=1 launcher.peer_timeout_s=300"
    for b in 8 16; do
      TAIL=4 step eta1_b$b 220 python3 -m areal_cli.cli train --quiet $RUN trainer.batch_size=$b run_dir=/tmp/runs/eta1_b$b
      step eta1_b${b}_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/eta1_b$b 2
      tar czf $OUT/eta1_b$b.tgz -C /tmp/runs --exclude=checkpoints eta1_b$b
    done
    ;;
  contention)
    # (overrides after `--`: --rows and --profile take several words each)
    TP="python3 benchmarks/trainer_profile.py --arch $MODEL --seqs 32 --length 40 --steps 12 --profile no_ckpt"
    OV="trainer.micro_batch_tokens=4096 trainer.logprob_chunk_tokens=2048"
    TAIL=4 step alone 150 $TP --rows no_ckpt no_ckpt+compile --out $OUT/alone -- $OV trainer.shard=true
    TAIL=4 step alone_nofsdp 90 $TP --rows no_ckpt --out $OUT/alone_nofsdp -- $OV trainer.shard=false
    beside() {  # TAG: the trainer rows beside a vLLM decode load on this GPU
      rm -f /tmp/load.ready /tmp/load.stop
      setsid python3 benchmarks/device/vllm_load.py $MODEL /tmp/load.ready /tmp/load.stop $OUT/load_$1.json \
          > $L/load_$1.log 2>&1 &
      local lp=$! n=0
      while [ ! -f /tmp/load.ready ] && kill -0 $lp 2>/dev/null && [ $n -lt 200 ]; do sleep 1; n=$((n+1)); done
      echo "load ready after ${n}s" | tee -a $S
      TAIL=4 step beside_$1 90 $TP --rows no_ckpt --out $OUT/beside_$1 -- $OV trainer.shard=true
      TAIL=4 step beside_nofsdp_$1 90 $TP --rows no_ckpt --out $OUT/beside_nofsdp_$1 -- $OV trainer.shard=false
      touch /tmp/load.stop; n=0
      while kill -0 $lp 2>/dev/null && [ $n -lt 30 ]; do sleep 1; n=$((n+1)); done
      kill -KILL -- -$lp 2>/dev/null; cat $OUT/load_$1.json | tee -a $S; tail -n 3 $L/load_$1.log >> $S; }
    beside plain
    if command -v nvidia-cuda-mps-control > /dev/null; then
      # a private MPS daemon: only processes given these two directories use it
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
      mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
      nvidia-cuda-mps-control -d && echo "MPS daemon started" | tee -a $S
      TAIL=6 step mps_ipc 120 $TF python3 -m pytest -q -p no:cacheprovider tests/gpu/test_ipc_weights.py
      beside mps
      echo quit | nvidia-cuda-mps-control; cat /tmp/mps/log/control.log 2>/dev/null | tail -n 5 >> $S
    else
      echo "no nvidia-cuda-mps-control on this machine" | tee -a $S
    fi
    for d in alone alone_nofsdp beside_plain beside_nofsdp_plain beside_mps beside_nofsdp_mps; do
      [ -f $OUT/$d/results.json ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for x in r.get('rows', r if isinstance(r, list) else []):
    print(sys.argv[2], x.get('row'), 'step', round(x.get('step_s', 0), 4), {k: round(v, 4) for k, v in x.get('breakdown', {}).items()})" \
        $OUT/$d/results.json $d | tee -a $S
      tail -n 3 $OUT/$d/kernels_no_ckpt.txt 2>/dev/null | tee -a $S
    done
    ;;
  agents)
    # the agent endpoint against single_turn on the one-GPU layout (benchmarks/agent_throughput.py):
    # the same model, engine, task and budgets; B = 32 x G = 8, <= 128 new tokens, 2 turns at most;
    # one single_turn run, then one run of each of AGENTS (one_call: the same single call as
    # single_turn, the endpoint's cost; then plan_then_answer); PYSPY=1 (default): py-spy --gil of
    # each run's rollout worker for SPY_FOR (20) s once it has run SPY_AFTER (35) s (vLLM starts in ~30 s)
    A=""; for a in ${AGENTS:-benchmarks.agent_throughput:one_call examples.agents.plan_then_answer:run}; do
      A="$A --agent $a"; done
    if [ "${PYSPY:-1}" = 1 ] && { command -v py-spy >/dev/null 2>&1 || [ -x /tmp/spy/bin/py-spy ]; }; then
      SPY=$(command -v py-spy || echo /tmp/spy/bin/py-spy)
      ( seen=""; while true; do
          for p in $(pgrep -f "areal_cli.rollout.main" 2>/dev/null); do
            case " $seen " in *" $p "*) continue ;; esac; seen="$seen $p"
            ( sleep ${SPY_AFTER:-35}; kill -0 $p 2>/dev/null && $SPY record -p $p -d ${SPY_FOR:-20} --gil --nonblocking --format raw \
                -o $OUT/pyspy_rollout_$p.txt > $L/pyspy_$p.log 2>&1 ) &
          done; sleep 2; done ) &
      spy=$!
    fi
    step agents ${LIMIT:-560} python3 -m benchmarks.agent_throughput --steps ${STEPS:-8} --warmup 2 \
        --batch 32 --group 8 --out /tmp/runs/agents $A \
        workflow.max_turns=2 engine=vllm model=$MODEL cluster.gpus=[0] rollout.max_new_tokens=128 \
        rollout.max_concurrent=0 trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300 ${EXTRA:-}
    [ -n "${spy:-}" ] && kill $spy 2>/dev/null
    grep -h -E "^(single_turn|agent) |/ single_turn" $L/agents.log | tee -a $S
    cp /tmp/runs/agents/agent_throughput.json $OUT/ 2>/dev/null
    tar czf $OUT/agents.tgz --exclude=checkpoints -C /tmp/runs agents 2>/dev/null
    ;;
  bench15)
    R=/tmp/rand/qwen2.5-1.5b
    [ -f $R/random_weights.json ] || step build15 300 python3 benchmarks/random_model.py qwen2.5-1.5b-instruct $R \
        --device cuda --tokenizer $MODEL
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
        > $OUT/bench15_${MODES:-sync}_gpu.csv 2>/dev/null &
    smi=$!
    # random weights earn reward 0: trainer.skip_zero_advantage=false keeps the trainer doing its work;
    # run_dir outside /tmp/runs, which `step` would move aside: the second call keeps the first mode
    TAIL=40 step bench15_${MODES:-sync} ${LIMIT:-570} python3 -m areal_cli.cli bench sync-vs-async \
        run_dir=/tmp/bench15 model=$R engine=vllm cluster.gpus=[0] trainer.batch_size=8 \
        rollout.group_size=8 task=arithmetic_long rollout.length_profile=arithmetic_long \
        rollout.max_new_tokens=2048 engine.vllm.max_model_len=3072 rollout.max_concurrent=0 trainer.steps=32 \
        bench.warmup=2 bench.eta=4 bench.heldout=false bench.modes=${MODES:-sync} \
        trainer.skip_zero_advantage=false launcher.peer_timeout_s=600 ${EXTRA:-}
    kill $smi 2>/dev/null
    tar czf $OUT/bench15.tgz --exclude=checkpoints -C /tmp bench15 2>/dev/null
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
cp -r $L $OUT/logs-$phase 2>/dev/null
cat $S
