"""pagedattn: a CPU-first paged-attention inference engine.

Layers (data flows one way): cli/server -> engine -> scheduler -> model runner -> model,
with the model calling the paged attention kernels over the paged KV cache.
"""

__version__ = "0.1.0"
