#!/usr/bin/env bash
# benchmarks/packing.py on one GPU (nothing staged needed: random SmolLM2-135M-shaped weights).
# Two workloads: the basic_arithmetic run's shape (256 sequences, prompts 70-130, answers 4-30
# tokens) and a reasoning-like one (64 sequences, answers 32-512 tokens).
OUT=${OUT:-/tmp/areal_out}; mkdir -p $OUT/profiles
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi -L; date -u +%FT%TZ
timeout 200 python3 benchmarks/packing.py --model random-135m --seqs 256 --group 8 --prompt 70 130 --response 4 30 \
  --micro-batch-tokens 16384 --packed-rows 16384 4096 2048 1024 --host-mask --phases --steps 3 \
  --profile-dir $OUT/profiles --json $OUT/packing_short.json 2>&1 | grep -v -E "Loading|Writing|Warning|warn"
timeout 150 python3 benchmarks/packing.py --model random-135m --seqs 64 --group 8 --prompt 70 130 --response 32 512 \
  --micro-batch-tokens 16384 --packed-rows 16384 2048 --phases --steps 3 --json $OUT/packing_long.json 2>&1 \
  | grep -v -E "Loading|Writing|Warning|warn"
cd $OUT && tar czf profiles.tgz profiles && rm -rf profiles
