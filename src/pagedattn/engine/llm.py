"""LLM: the offline facade (vLLM's ``LLM``): generate a list of prompts, results in input order."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import Progress

from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import CompletionOutput
from pagedattn.sampling_params import SamplingParams

Prompt = str | Sequence[int]
Message = Mapping[str, Any]


def engine_config(model: str | None = None, **kwargs: Any) -> EngineConfig:
    """An EngineConfig from flat keyword arguments.

    Args:
        model: model path, None = the embedded default model.
        kwargs: any CacheConfig field (page_size, num_pages, kv_cache_mib,
            enable_prefix_caching, sliding_window, num_sink_tokens, position_mode), any
            SchedulerConfig field (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
            max_model_len), and ``seed``.

    Raises:
        ValueError: an unknown keyword, or a value the configs reject.
    """
    cache_fields = {f.name for f in dataclasses.fields(CacheConfig)}
    sched_fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    unknown = set(kwargs) - cache_fields - sched_fields - {"seed"}
    if unknown:
        raise ValueError(
            f"unknown engine option(s) {sorted(unknown)}; expected one of "
            f"{sorted(cache_fields | sched_fields | {'seed'})}"
        )
    return EngineConfig(
        model=model,
        cache=CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_fields}),
        scheduler=SchedulerConfig(**{k: v for k, v in kwargs.items() if k in sched_fields}),
        seed=kwargs.get("seed", 0),
    )


class LLM:
    """Offline batch generation.

    Args:
        model: a GGUF file / safetensors folder path, or None for the embedded SmolLM2.
        engine: use this engine instead of loading ``model`` (e.g. a tiny test model).
        kwargs: engine options, see :func:`engine_config`.

    Raises:
        ValueError, FileNotFoundError: from the configs or the loader.
    """

    def __init__(
        self, model: str | None = None, *, engine: LLMEngine | None = None, **kwargs: Any
    ) -> None:
        self.engine = (
            engine if engine is not None else LLMEngine.from_config(engine_config(model, **kwargs))
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[CompletionOutput]:
        """Generate for every prompt; return the finished requests in input order.

        Args:
            prompts: one prompt or a list; a prompt is text or a list of token ids (a flat list
                of ints is one token-id prompt).
            sampling_params: one for all prompts, or one per prompt; None = SamplingParams().
            use_tqdm: show a progress bar (rich) of finished requests.

        Raises:
            ValueError: a per-prompt params list of the wrong length, or a bad prompt.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompt_list: list[Prompt] = [prompts]  # type: ignore[list-item]
        else:
            prompt_list = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params = list(sampling_params)
            if len(params) != len(prompt_list):
                raise ValueError(
                    f"sampling_params: expected 1 or {len(prompt_list)} entries, got {len(params)}"
                )
        results: dict[str, CompletionOutput] = {}
        order = []
        for prompt, p in zip(prompt_list, params, strict=True):
            ids = self.engine.encode(prompt)
            rid = self.engine.add_request(ids, p)
            order.append(rid)
            stored = prompt if isinstance(prompt, str) else list(prompt)
            results[rid] = CompletionOutput(request_id=rid, prompt=stored, prompt_token_ids=ids)
        # The bar goes to stderr and only to a terminal: stdout stays the caller's.
        console = Console(stderr=True)
        show = use_tqdm and console.is_terminal
        with Progress(console=console, disable=not show, transient=True) as progress:
            task = progress.add_task("generating", total=len(order))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    result = results.get(out.request_id)
                    if result is None:  # someone else's request on a shared engine
                        continue
                    result.text += out.text
                    result.token_ids += out.token_ids
                    if out.finished:
                        result.finish_reason = out.finish_reason
                        result.error = out.error
                        result.num_cached_tokens = out.num_cached_tokens
                        result.metrics = out.metrics
                        progress.advance(task)
        return [results[rid] for rid in order]

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[CompletionOutput]:
        """Generate replies to one conversation or a list of them (the model's chat template).

        Args:
            messages: ``[{"role": ..., "content": ...}, ...]`` or a list of such lists.

        Raises:
            ValueError: no tokenizer or no chat template.
        """
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("chat: the engine has no tokenizer")
        convs = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts: list[Prompt] = [tokenizer.encode_chat(conv) for conv in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
