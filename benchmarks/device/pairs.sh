#!/usr/bin/env bash
# Phases of model_sizes.sh at once, each on its own GPUs of one machine (after the stage phases):
#   bash benchmarks/device/pairs.sh agents@0,1 update7b@2,3@VERSIONS=6,LIMIT=200
# A spec is PHASE@GPUS[@VAR=VALUE,...]: the phase runs with CUDA_VISIBLE_DEVICES=GPUS (its GPU ids count
# among those) and the variables in its environment. The default model is converted once before the
# phases start (they would race for it). Each phase writes under /tmp/pairs/PHASE; at the end every
# folder is packed into $OUT/PHASE.tgz (a call brings back few files) and the summaries are joined into
# $OUT/summary.txt, in the order of the specs.
set -u
OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT" /tmp/pairs
( OUT=/tmp/pairs/model bash benchmarks/device/model_sizes.sh model ) > /tmp/pairs/model.log 2>&1
tail -n 3 /tmp/pairs/model.log
names=()
for spec in "$@"; do
  IFS=@ read -r ph gpus vars <<< "$spec"
  names+=("$ph")
  mkdir -p "/tmp/pairs/$ph"
  # shellcheck disable=SC2086  # VAR=VALUE words, split on the commas
  ( export CUDA_VISIBLE_DEVICES=$gpus OUT=/tmp/pairs/$ph; [ -n "$vars" ] && export ${vars//,/ }
    bash benchmarks/device/model_sizes.sh "$ph" ) > "/tmp/pairs/$ph.log" 2>&1 &
  echo "== $ph on GPUs $gpus ${vars:+($vars) }started $(date -u +%T)"
done
wait
: > "$OUT/summary.txt"
for ph in "${names[@]}"; do
  { echo "######## $ph"; cat "/tmp/pairs/$ph/summary.txt" 2>/dev/null || tail -n 30 "/tmp/pairs/$ph.log"; } \
      >> "$OUT/summary.txt"
  tar czf "$OUT/$ph.tgz" -C /tmp/pairs "$ph" "$ph.log"
done
cat "$OUT/summary.txt"
