"""engine=vllm: vllm.LLM in the worker (its own GPU workers, tensor parallel), receiving weights in
place through its loaders or through vLLM's own NCCL transfer (``weights.py``, ``inplace.py``)."""
