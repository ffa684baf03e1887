#!/usr/bin/env bash
# Phases of model_sizes.sh one after another, for one detached job that keeps a lent machine busy between
# calls (bash benchmarks/device/detach.sh start seq bash benchmarks/device/sequence.sh PHASE...):
#   bash benchmarks/device/sequence.sh nanprobe STEPS=30 bench2 GPUTESTS=0 gradcheck
# Words VAR=VALUE set the environment of the next phase only. Each phase's results go to $OUT/PHASE
# ($OUT/PHASE.2 for its second run), its log to $OUT/sequence.log beside a line per phase with its exit status.
set -u
OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT"
envs=(); declare -A runs
for w in "$@"; do
  if [[ $w == *=* ]]; then envs+=("$w"); continue; fi
  n=$(( ${runs[$w]:-0} + 1 )); runs[$w]=$n
  out=$OUT/$w; [ "$n" -gt 1 ] && out=$OUT/$w.$n
  echo "#### $w ${envs[*]:-} ($(date -u +%T))" | tee -a "$OUT/sequence.log"
  env "${envs[@]}" OUT="$out" bash benchmarks/device/model_sizes.sh "$w"
  echo "#### $w rc=$? ($(date -u +%T))" | tee -a "$OUT/sequence.log"
  envs=()
done
