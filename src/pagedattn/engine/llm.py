"""LLM: the offline facade (vLLM's ``LLM``): generate a list of prompts, results in input order."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig, resolve_speculative
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import RequestOutput, merge_delta
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
            max_model_len), ``seed``, ``kv_store`` (a directory or ``redis://HOST:PORT/DB``),
            ``kv_store_key`` (a shared secret that signs the tier's records),
            ``kv_store_deadline_s`` (the most a tier restore may take), ``backend``
            (numpy, torch), ``device`` (cpu, cuda) and ``activations`` (float32, int8).
            ``speculative`` also takes ``"auto"`` (the default: n-gram speculative decoding
            where it is bitwise lossless, the numpy backend without a sliding window; each
            request drafts only while its acceptance pays) and ``"none"`` (off).

    Raises:
        ValueError: an unknown keyword, or a value the configs reject.
    """
    cache_fields = {f.name for f in dataclasses.fields(CacheConfig)}
    sched_fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    engine_fields = {
        "seed",
        "kv_store",
        "kv_store_key",
        "kv_store_deadline_s",
        "backend",
        "device",
        "activations",
    }
    unknown = set(kwargs) - cache_fields - sched_fields - engine_fields
    if unknown:
        raise ValueError(
            f"unknown engine option(s) {sorted(unknown)}; expected one of "
            f"{sorted(cache_fields | sched_fields | engine_fields)}"
        )
    kwargs = dict(kwargs)
    kwargs["speculative"] = resolve_speculative(
        kwargs.get("speculative", "auto"),
        kwargs.get("backend", "numpy"),
        kwargs.get("sliding_window"),
    )
    return EngineConfig(
        model=model,
        cache=CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_fields}),
        scheduler=SchedulerConfig(**{k: v for k, v in kwargs.items() if k in sched_fields}),
        seed=kwargs.get("seed", 0),
        kv_store=kwargs.get("kv_store"),
        kv_store_key=kwargs.get("kv_store_key"),
        kv_store_deadline_s=kwargs.get("kv_store_deadline_s", 0.5),
        backend=kwargs.get("backend", "numpy"),
        device=kwargs.get("device"),
        activations=kwargs.get("activations", "float32"),
    )


class LLM:
    """Offline batch generation.

    With a ``kv_store``, pages are written to the tier on a background thread: call
    :meth:`close` (or use ``with LLM(...) as llm:``) so that the queued writes land before the
    process exits.

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

    def close(self) -> None:
        """Write every queued page to the tier and close it (idempotent; a no-op without one)."""
        self.engine.close()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix of the KV pool (vLLM's ``LLM.reset_prefix_cache``)."""
        return self.engine.reset_prefix_cache()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; return one final RequestOutput per prompt, in input order.

        Each RequestOutput's ``outputs`` hold the whole completions (all step deltas joined),
        ordered by index.

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
        results: dict[str, RequestOutput] = {}
        order = []
        for prompt, p in zip(prompt_list, params, strict=True):
            rid = self.engine.add_request(prompt, p)
            order.append(rid)
        # The bar goes to stderr and only to a terminal: stdout stays the caller's.
        from rich.console import Console  # lazily: `pagedattn generate` never draws a bar
        from rich.progress import Progress

        console = Console(stderr=True)
        show = use_tqdm and console.is_terminal
        mine = set(order)
        with Progress(console=console, disable=not show, transient=True) as progress:
            task = progress.add_task("generating", total=len(order))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.request_id not in mine:  # someone else's request on a shared engine
                        continue
                    merge_delta(results, out)
                    if out.finished:
                        progress.advance(task)
        return [results[rid] for rid in order]

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
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
