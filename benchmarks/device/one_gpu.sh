#!/usr/bin/env bash
# One GPU, the trainer and the engine on the same card (weights through CUDA IPC), on a lent
# 1-GPU machine; one phase per `run` call, the calls back to back (the machine stays warm ~30 s):
# (a call carries at most 64 MiB with the tree: split the vLLM overlay 48 + 28 MiB)
#   stage1  carry .vllm/a                    vLLM overlay, part 1
#   stage2  carry .vllm/b .whl .tf .extwhl   vLLM part 2, wheels, transformers 5.24, pytest
#   stage3  carry .models/a                  model part 1
#   check   carry .models/b                  model part 2; the GPU tests (tests/gpu: the IPC
#                                            broadcast, a short run of each engine on one GPU)
#   staleness  carry .models/b               (after stage3, instead of check) the IPC test; the
#                                            default engine on one GPU at rollout.max_staleness=1,
#                                            8 and 16 groups a step
#   pair    (nothing carried)                the default model, 50 steps + closing evaluation on
#                                            cluster.gpus=[0], engine=vllm then engine=hf
# Results: $OUT/summary.txt, the runs' summaries and logs.
set -u
phase=${1:?phase}
BUDGET=${BUDGET:-590}
source benchmarks/device/common.sh
MODEL=$(model)
echo "model: $MODEL" | tee -a $S
case $phase in
  check)
    TAIL=25 step gpu_ipc 150 $TF python3 -m pytest -q -p no:cacheprovider tests/gpu/test_ipc_weights.py
    TAIL=40 step gpu_vllm_run 300 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_one_gpu_run.py -k vllm
    TAIL=40 step gpu_hf_run 120 $TF python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_one_gpu_run.py -k hf
    ;;
  pair)
    RUN="model=$MODEL cluster.gpus=[0] trainer.steps=${STEPS:-50} trainer.batch_size=8 launcher.peer_timeout_s=300"
    TAIL=20 step vllm50 ${VLLM_LIMIT:-240} python3 -m areal_cli.cli train $RUN engine=vllm \
        engine.gpu_memory_utilization=0.3 run_dir=/tmp/runs/vllm50
    step vllm50_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/vllm50 2
    TAIL=20 step hf50 ${HF_LIMIT:-330} $TF python3 -m areal_cli.cli train $RUN engine=hf run_dir=/tmp/runs/hf50
    step hf50_summary 30 $TF python3 benchmarks/device/run_summary.py /tmp/runs/hf50 2
    for r in vllm50 hf50; do
      [ -d /tmp/runs/$r ] && tar czf $OUT/$r.tgz -C /tmp/runs --exclude=checkpoints $r
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
  *) echo "unknown phase $phase"; exit 2 ;;
esac
cp -r $L $OUT/logs-$phase 2>/dev/null
cat $S
