#!/usr/bin/env bash
# vLLM 0.26.0's MoE kernels for the offline GPU machine: the slim overlay leaves out
# vllm/_moe_C_stable_libtorch.abi3.so (torch.ops._moe_C: topk_softmax, moe_align_block_size,
# moe_sum, ... which vLLM's fused_moe Triton path calls); this takes it from the PyPI wheel
# (Python 3.12, manylinux x86_64, torch 2.11 + CUDA 13) into one xz tarball in <= 60 MiB parts
# under .vllm/moe/ (git-ignored), with its SHA256. Needs: PyPI access, python3 with pip, xz.
#   bash benchmarks/device/build_moe_kernels.sh OUTDIR
# On the GPU machine, after stage1 and stage2: `bash benchmarks/device/one_gpu.sh stage_moe`
# carrying .vllm/moe (benchmarks/device/stage_moe.sh unpacks it into the overlay).
set -euo pipefail
out=${1:?usage: build_moe_kernels.sh OUTDIR}; mkdir -p "$out/dl"
root=$(cd "$(dirname "$0")/../.." && pwd); parts=${MOE_PARTS:-$root/.vllm/moe}
# what vLLM's MoE layers need beyond the slim overlay (the overlay keeps every .py and the tuned
# fused_moe configs/*.json; only these shared objects were removed)
files=(vllm/_moe_C_stable_libtorch.abi3.so)
plat=""; for n in 17 24 26 27 28 31; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
plat="$plat --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
ls "$out"/dl/vllm-0.26.0-*.whl > /dev/null 2>&1 || python3 -m pip download -q --no-deps \
    --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$out/dl" vllm==0.26.0
whl=$(ls "$out"/dl/vllm-0.26.0-*.whl | head -n 1)
rm -rf "$out/x"; mkdir -p "$out/x"
python3 - "$whl" "$out/x" "${files[@]}" <<'PY'
import sys, zipfile
whl, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(whl) as z:
    for n in names:
        z.extract(n, dest)  # KeyError names a file the wheel lacks
PY
tar -C "$out/x" -cf - "${files[@]}" | xz -9e -T0 -c > "$out/vllm026_moe.tar.xz"
rm -rf "$parts"; mkdir -p "$parts"
split -b 60M -d -a 2 "$out/vllm026_moe.tar.xz" "$parts/vllm026_moe.tar.xz.part"
sha256sum "$out/vllm026_moe.tar.xz" | cut -d' ' -f1 > "$parts/SHA256"
ls -l "$out/x/vllm" "$out/vllm026_moe.tar.xz" "$parts"
