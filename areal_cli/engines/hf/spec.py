"""What engine=hf declares: a torch model its caller loads, one device, areal's bucketed broadcast
into its parameters (the ``EngineSpec`` defaults), LoRA adapters merged in place."""

from areal_cli.engines.spec import EngineSpec

SPEC = EngineSpec("hf", loads_model=False, tensor_parallel=False, fp32_logits=False,
                  merges_lora=False,
                  lora_apply="each hf engine merges W0 + (alpha/rank)·B·A into its weights "
                             "in place",
                  module="select")
