"""pagedattn: a CPU-first paged-attention inference engine.

Layers (data flows one way): cli/server -> engine -> scheduler -> model runner -> model,
with the model calling the paged attention kernels over the paged KV cache.

``from pagedattn import LLM, SamplingParams`` is the offline API (vLLM's names); the names are
imported on first use so that ``import pagedattn`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from pagedattn.engine.llm import LLM
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.engine.outputs import CompletionOutput, Logprob, RequestOutput
    from pagedattn.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "pagedattn.engine.llm",
    "LLMEngine": "pagedattn.engine.llm_engine",
    "RequestOutput": "pagedattn.engine.outputs",
    "CompletionOutput": "pagedattn.engine.outputs",
    "Logprob": "pagedattn.engine.outputs",
    "SamplingParams": "pagedattn.sampling_params",
}
__all__ = ["LLM", "CompletionOutput", "LLMEngine", "Logprob", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedattn' has no attribute {name!r}")
    return getattr(import_module(module), name)
