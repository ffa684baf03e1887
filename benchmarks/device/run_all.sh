#!/usr/bin/env bash
# The GPU path on a lent 2-GPU machine (kind nvidia-h100-x2), one phase per `run` call, the
# calls back to back (the machine stays warm ~30 s). From the project root:
#   stage1  carry .vllm/a                vLLM overlay, part 1 (+ prints the machine)
#   stage2  carry .vllm/b .whl           vLLM overlay, part 2; wheels
#   stage3  carry .models/a .whl         model part 1
#   main    carry .models/b .whl         model part 2; install; vLLM check (weight transfer,
#                                        logprobs, decode tokens/s vs hf); areal train engine=vllm
#                                        (50 steps) with held-out greedy accuracy before/after
#   bench   carry .whl                   areal bench sync-vs-async engine=vllm
#   decode  carry .models/b .whl         (instead of main) decode tokens/s, vllm vs hf engine; stage2
#                                        then also carries .tf (a transformers 5.24 wheel for hf)
# Results go to $OUT (one tarball + the headline JSON files).
set -u
phase=${1:?phase}
OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT"
case $phase in
  stage1) source .vllm/a/vllm_stage.sh; nvidia-smi -L; python3 -V
          python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
          exit 0 ;;
  stage2) source .vllm/b/vllm_stage.sh; source .whl/on-device.sh
          # transformers 5.24 (the CPU machine's) for the hf engine only: the image's 5.17 lacks its API
          [ -d .tf ] && python3 -m pip install -q --no-index --no-deps --target /tmp/tf524 .tf/*.whl; exit 0 ;;
  stage3) source .whl/on-device.sh; exit 0 ;;
esac
source .whl/on-device.sh
export AREAL_CACHE=/tmp/areal_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PYTHONPATH
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip -e failed; using PYTHONPATH"
MODEL=$(python3 -c "from areal_cli.model_source import resolve_model; print(resolve_model('/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf'))") || exit 1
echo "model: $MODEL  $(date -u +%FT%TZ)"
EVAL="task.eval_size=200 eval.size=200 rollout.max_new_tokens=128"
RUN="engine=vllm model=$MODEL trainer.batch_size=32 rollout.group_size=8 rollout.max_new_tokens=128
     rollout.max_concurrent=0 trainer.micro_batch_tokens=16384 launcher.peer_timeout_s=300 task.eval_size=200"
step() { local name=$1 t=$2; shift 2; echo "== $name ($(date -u +%T))"; timeout "$t" "$@" 2>&1 | tee "$OUT/$name.log"; echo "== $name rc=${PIPESTATUS[0]}"; }
if [ "$phase" = main ]; then
  step vllm_check 210 python3 benchmarks/device/vllm_check.py "$MODEL" "$OUT/vllm_check.json"
  step heldout_before 60 python3 benchmarks/device/heldout.py "$MODEL" $EVAL
  step train_vllm 300 python3 -m areal_cli.cli train --quiet $RUN run_dir=/tmp/runs/vllm50 trainer.steps=50
  step heldout_after 60 python3 benchmarks/device/heldout.py /tmp/runs/vllm50/checkpoints/final $EVAL
  step train_summary 30 python3 benchmarks/device/run_summary.py /tmp/runs/vllm50 2
  tar czf "$OUT/main_runs.tgz" --exclude=checkpoints -C /tmp runs "$OUT"/*.log 2>/dev/null
fi
if [ "$phase" = decode ]; then   # vLLM vs the embedded hf engine, same card, same prompts
  step decode_vllm 240 python3 benchmarks/device/decode_compare.py vllm "$MODEL" "$OUT/decode_vllm.json"
  step decode_hf 240 env PYTHONPATH=/tmp/tf524:$PYTHONPATH python3 benchmarks/device/decode_compare.py hf "$MODEL" "$OUT/decode_hf.json"
fi
if [ "$phase" = bench ]; then
  step bench 540 python3 -m areal_cli.cli bench sync-vs-async $RUN run_dir=/tmp/runs/bench trainer.steps=${STEPS:-20} \
       bench.warmup=3 bench.eta=4 $EVAL
  cp /tmp/runs/bench/bench.json /tmp/runs/bench/*.png "$OUT"/ 2>/dev/null
  tar czf "$OUT/bench_runs.tgz" --exclude=checkpoints -C /tmp runs 2>/dev/null
fi
