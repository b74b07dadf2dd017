"""Run one request on an engine, writing its text as it arrives, and summarise its timings.

Shared by `pagedattn generate` and `pagedattn chat`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.sampling_params import SamplingParams


@dataclass
class StreamResult:
    """One finished request as the CLI saw it.

    Attributes:
        prompt_token_ids: the prompt ids sent to the engine.
        token_ids: every generated id (a final end-of-sequence id included).
        text: the joined text deltas (special tokens and stop strings excluded).
        finish_reason, error: from the engine's last output.
        num_cached_tokens: prompt tokens served from the prefix cache.
        ttft_s: time to first token (arrival -> first token), seconds.
        prefill_s: first scheduled -> first token, seconds (the prompt's forward passes).
        decode_s: first token -> last token, seconds (covers ``len(token_ids) - 1`` tokens).
        peak_pages: most KV pages referenced while a step of this request ran.
        peak_group_bytes: per layer group (``full``, ``sliding_W``), the most bytes of K and V
            its referenced pages held while a step ran.
        num_pages, page_size: the pool's size and page size.
        num_tier_tokens: prompt tokens restored from the persistent KV tier (None: no tier).
        warmup_s: seconds of the warm-up request run before this one (see :func:`warm_up`),
            None when there was none.
    """

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    ttft_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    peak_pages: int = 0
    peak_group_bytes: dict[str, int] = field(default_factory=dict)
    num_pages: int = 0
    page_size: int = 0
    num_tier_tokens: int | None = None
    warmup_s: float | None = None

    @property
    def prefill_tok_s(self) -> float | None:
        """Computed (not cached) prompt tokens per second of prefill."""
        computed = len(self.prompt_token_ids) - self.num_cached_tokens
        if not self.prefill_s or self.prefill_s <= 0:
            return None
        return computed / self.prefill_s

    @property
    def decode_tok_s(self) -> float | None:
        """Generated tokens after the first, per second (None with fewer than 2 tokens)."""
        if len(self.token_ids) < 2 or not self.decode_s or self.decode_s <= 0:
            return None
        return (len(self.token_ids) - 1) / self.decode_s


def warm_up(engine: LLMEngine) -> float:
    """Compile or load every kernel the request will run, before it (so that its timings do
    not include that one-time work): :func:`pagedattn.engine.warm_up.warm_up`.

    Returns:
        The warm-up's wall time in seconds.
    """
    from pagedattn.engine.warm_up import warm_up as engine_warm_up

    return engine_warm_up(engine, compile_in_parallel=True)  # built from its config


def stream_request(
    engine: LLMEngine,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    write: Callable[[str], None],
) -> StreamResult:
    """Run one request alone on ``engine``, calling ``write`` with each non-empty text delta.

    Args:
        engine: an idle engine (other requests would share the steps and the page counts).
        prompt_token_ids: (prompt_len,) token ids.
        params: sampling parameters.
        write: called with each text delta as it arrives (write and flush it).

    Returns:
        The finished request with its timings.

    Raises:
        ValueError: a bad prompt (see ``LLMEngine.encode``). KeyboardInterrupt: re-raised after
            the request is aborted and its pages released.
    """
    result = StreamResult(prompt_token_ids=[int(t) for t in prompt_token_ids])
    request_id = engine.add_request(result.prompt_token_ids, params)
    result.num_pages = engine.cache_manager.num_pages
    result.page_size = engine.config.cache.page_size
    tier_before = engine.cache_manager.tier_restored_tokens
    try:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            result.peak_pages = max(result.peak_pages, outputs.report.num_pages_used)
            for name, held in outputs.report.kv_group_bytes:
                result.peak_group_bytes[name] = max(result.peak_group_bytes.get(name, 0), held)
            for out in outputs:
                if out.request_id != request_id:
                    continue
                completion = out.outputs[0]
                if completion.text:
                    write(completion.text)
                result.text += completion.text
                result.token_ids += completion.token_ids
                result.num_cached_tokens = out.num_cached_tokens
                if out.finished:
                    result.finish_reason, result.error = completion.finish_reason, out.error
                    m = out.metrics
                    if m.first_token_time is not None:
                        result.ttft_s = m.first_token_time - m.arrival_time
                        if m.first_scheduled_time is not None:
                            result.prefill_s = m.first_token_time - m.first_scheduled_time
                        if m.last_token_time is not None:
                            result.decode_s = m.last_token_time - m.first_token_time
    except KeyboardInterrupt:
        engine.abort(request_id)
        while engine.has_unfinished_requests():
            engine.step()
        raise
    finally:
        if engine.kv_tier is not None:
            result.num_tier_tokens = engine.cache_manager.tier_restored_tokens - tier_before
    return result


def format_stats(result: StreamResult) -> str:
    """The ``--stats`` block: one ``name: value`` line per figure."""

    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} tok/s"

    def secs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f} s"

    computed = len(result.prompt_token_ids) - result.num_cached_tokens
    lines = []
    if result.warmup_s is not None:
        lines.append(
            f"warm-up: {secs(result.warmup_s)} (kernel compile or cache load, timed apart; "
            "not in the figures below)"
        )
    lines += [
        f"prefill: {rate(result.prefill_tok_s)} ({computed} prompt tokens computed "
        f"in {secs(result.prefill_s)})",
        f"decode: {rate(result.decode_tok_s)} ({len(result.token_ids)} tokens generated)",
        f"time to first token: {secs(result.ttft_s)}",
        f"pages used (peak): {result.peak_pages} of {result.num_pages} "
        f"(page_size {result.page_size})",
        *(
            f"kv resident (peak) {name}: {held / 2**20:.2f} MiB"
            for name, held in result.peak_group_bytes.items()
        ),
        f"cached prompt tokens: {result.num_cached_tokens} of {len(result.prompt_token_ids)}",
        f"finish reason: {result.finish_reason}",
    ]
    if result.num_tier_tokens is not None:
        lines.insert(-1, f"prompt tokens from the kv store: {result.num_tier_tokens}")
    return "\n".join(lines)
