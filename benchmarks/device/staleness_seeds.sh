#!/usr/bin/env bash
# benchmarks/staleness_seeds.py on the CPU cores of a lent GPU machine (no GPU used): the CPU
# default run for several seeds per maximum staleness η, 2 cores per run, each final checkpoint
# evaluated on 1,000 held-out problems. The study runs in its own process session across calls.
#   stage   carry .whl .tf       wheels, transformers 5.24 (-> /tmp/tf524); prints the CPUs
#   modela  carry .models/a      default model part 1
#   start   carry .models/b      model part 2, converts it, starts the study, waits WAIT s (540)
#   gpu     carry .models/b      as start, but one study per GPU, each on its share of the cores, its
#                                runs colocated on that GPU; ARMS="name:override override;name2:..."
#                                gives each study its overrides (one arm per GPU, in GPU order)
#   wait    (no carry)           waits up to WAIT s for the study to end, then copies its results
# Env: ETAS (0,1,2,4), SEEDS (0-7), WAIT, and study overrides in OVERRIDES.
# Results: $OUT/summary.json (gpu: $OUT/<arm>.json), $OUT/study.log, $OUT/logs.tgz (each run's
# logs and metrics).
set -u
phase=${1:?phase}
OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT"
case $phase in
  stage) source benchmarks/device/on_device.sh
         python3 -m pip install -q --no-index --no-deps --target /tmp/tf524 .tf/*.whl
         nproc; lscpu | grep -iE "model name|thread|core|socket|mhz"; free -g | head -2; python3 -V; exit 0 ;;
  modela) source benchmarks/device/on_device.sh; exit 0 ;;
esac
source benchmarks/device/on_device.sh
export AREAL_CACHE=/tmp/areal_cache PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/areal_src:/tmp/tf524:$PYTHONPATH
copy_results() {
  cp /tmp/study/summary.json "$OUT/" 2>/dev/null; cp /tmp/study*.log "$OUT/" 2>/dev/null
  for d in /tmp/study/*/; do [ -f "$d/summary.json" ] && cp "$d/summary.json" "$OUT/$(basename "$d").json"; done
  tar czf "$OUT/logs.tgz" -C /tmp/study --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' . 2>/dev/null; }
alive() { local p; for p in $(cat /tmp/study.pid 2>/dev/null); do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
wait_study() { local n=0
  while alive && [ $n -lt "${WAIT:-540}" ]; do sleep 5; n=$((n+5)); done
  tail -n 40 /tmp/study*.log; }
model_dir() { (cd /tmp/areal_src && python3 -c "from areal_cli.model_source import resolve_model; print(resolve_model('/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf'))"); }
case $phase in
  start)
    rm -rf /tmp/areal_src && mkdir -p /tmp/areal_src && cp -r areal_cli benchmarks conf /tmp/areal_src/
    M=$(model_dir); echo "model: $M"
    # its own session: the study outlives this call while the machine stays held
    (cd /tmp/areal_src && setsid python3 benchmarks/staleness_seeds.py --etas "${ETAS:-0,1,2,4}" \
      --seeds "${SEEDS:-0-7}" --out /tmp/study model="$M" ${OVERRIDES:-} > /tmp/study.log 2>&1 & echo $! > /tmp/study.pid)
    sleep 90; tail -n 5 /tmp/study/eta0_seed0.train.log /tmp/study.log
    wait_study; copy_results ;;
  gpu)
    rm -rf /tmp/areal_src /tmp/study && mkdir -p /tmp/areal_src /tmp/study && cp -r areal_cli benchmarks conf /tmp/areal_src/
    M=$(model_dir); echo "model: $M"; nvidia-smi -L
    IFS=';' read -ra arms <<< "${ARMS:?ARMS}"
    n=$(nproc); per=$(( n / ${#arms[@]} )); : > /tmp/study.pid
    for i in "${!arms[@]}"; do
      name=${arms[$i]%%:*}; ov=${arms[$i]#*:}; lo=$(( i * per )); hi=$(( lo + per - 1 ))
      echo "arm $name on GPU $i, cores $lo-$hi: $ov"
      (cd /tmp/areal_src && setsid taskset -c $lo-$hi python3 benchmarks/staleness_seeds.py --gpu "$i" \
        --etas "${ETAS:-0,4}" --seeds "${SEEDS:-0-3}" --out /tmp/study/$name model="$M" ${OVERRIDES:-} $ov \
        > /tmp/study_$name.log 2>&1 & echo $! >> /tmp/study.pid)
    done
    sleep 120; tail -n 3 /tmp/study/*/eta0_seed0.train.log
    wait_study; copy_results ;;
  wait) wait_study; copy_results ;;
  *) echo "unknown phase $phase (stage modela start gpu wait)"; exit 2 ;;
esac
echo "== $phase done $(date -u +%T)"
