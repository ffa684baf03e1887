# Source on the GPU machine after stage1 and stage2 (the vLLM overlay in /tmp/vsite), carrying
# .vllm/moe (built by benchmarks/device/build_moe_kernels.sh): joins its parts, checks them against
# SHA256 and unpacks vLLM's MoE kernels (vllm/_moe_C_stable_libtorch.abi3.so) into the overlay, then
# loads them once (torch.ops._moe_C) to show they match this machine's torch and CUDA.
mkdir -p /tmp/vparts/moe
cp .vllm/moe/vllm026_moe.tar.xz.part* .vllm/moe/SHA256 /tmp/vparts/moe/ 2>/dev/null
if [ ! -f /tmp/vsite/.done ]; then
  echo "vllm moe kernels: stage the overlay first (stage1 carrying .vllm/a, stage2 carrying .vllm/b)" >&2
elif [ ! -f /tmp/vsite/.moe_done ]; then
  cat /tmp/vparts/moe/vllm026_moe.tar.xz.part* > /tmp/vparts/moe.tar.xz
  if [ "$(sha256sum /tmp/vparts/moe.tar.xz | cut -d' ' -f1)" = "$(cat /tmp/vparts/moe/SHA256 2>/dev/null)" ]; then
    python3 -c "import sys,tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='data')" \
      /tmp/vparts/moe.tar.xz /tmp/vsite && touch /tmp/vsite/.moe_done
  else
    echo "vllm moe kernels: parts do not match their checksum (carry .vllm/moe)" >&2
  fi
  rm -f /tmp/vparts/moe.tar.xz
fi
if [ -f /tmp/vsite/.moe_done ]; then
  PYTHONPATH=/tmp/vsite python3 -c "import torch, vllm._moe_C_stable_libtorch
ops = torch.ops._moe_C
print('vllm moe kernels: ready in /tmp/vsite/vllm', [n for n in ('topk_softmax', 'moe_align_block_size', 'moe_sum') if hasattr(ops, n)])"
fi
