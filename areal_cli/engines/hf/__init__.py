"""engine=hf: the model in the worker's own process (the slot loop on the CPU, transformers'
continuous batching on a GPU), receiving areal's bucketed broadcast into its parameters."""
