"""`pagedattn generate PROMPT`: stream one answer to stdout."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pagedattn.cli.app import app
from pagedattn.cli.options import (
    ActivationsOption,
    BackendOption,
    DeviceOption,
    IgnoreEosOption,
    KvCacheDtypeOption,
    KvCacheMibOption,
    KvStoreDeadlineOption,
    KvStoreKeyOption,
    KvStoreOption,
    MaxTokensOption,
    ModelOption,
    PageSizeOption,
    PositionModeOption,
    PrefixCachingOption,
    SeedOption,
    SinksOption,
    SlidingWindowOption,
    SpeculativeOption,
    StatsOption,
    SystemOption,
    TemperatureOption,
    TopKOption,
    TopPOption,
    build_engine,
    build_sampling_params,
    cli_errors,
)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command("generate")
def generate(
    prompt: Annotated[
        str, typer.Argument(metavar="PROMPT", help="The user message (or plain text with --raw).")
    ],
    raw: Annotated[
        bool, typer.Option("--raw", metavar="", help="Plain completion: no chat template.")
    ] = False,
    system: SystemOption = None,
    max_tokens: MaxTokensOption = 128,
    temperature: TemperatureOption = 0.0,
    top_p: TopPOption = 1.0,
    top_k: TopKOption = 0,
    seed: SeedOption = None,
    ignore_eos: IgnoreEosOption = False,
    model: ModelOption = None,
    page_size: PageSizeOption = 16,
    kv_cache_mib: KvCacheMibOption = 256.0,
    sliding_window: SlidingWindowOption = 0,
    sinks: SinksOption = 0,
    position_mode: PositionModeOption = "absolute",
    prefix_caching: PrefixCachingOption = True,
    kv_store: KvStoreOption = None,
    kv_store_key: KvStoreKeyOption = None,
    kv_store_deadline: KvStoreDeadlineOption = 0.5,
    backend: BackendOption = "numpy",
    device: DeviceOption = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    speculative: SpeculativeOption = None,
    stats: StatsOption = False,
) -> None:
    """Generate an answer to PROMPT, streamed to stdout as tokens arrive.

    The chat template wraps PROMPT as a user message (after --system, if given) unless --raw.

    Defaults: greedy (temperature 0, reproducible), at most 128 new tokens, end-of-turn stops.

    Errors print one line to stderr and exit 1 (2 for an invalid or missing --backend / --device).
    """
    with cli_errors():
        params = build_sampling_params(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            ignore_eos=ignore_eos,
        )
        if raw and system is not None:
            raise ValueError("--system needs the chat template; drop --raw")
        engine = build_engine(
            model,
            page_size=page_size,
            kv_cache_mib=kv_cache_mib,
            sliding_window=sliding_window,
            sinks=sinks,
            position_mode=position_mode,
            prefix_caching=prefix_caching,
            kv_store=kv_store,
            kv_store_key=kv_store_key,
            kv_store_deadline_s=kv_store_deadline,
            backend=backend,
            device=device,
            activations=activations,
            kv_cache_dtype=kv_cache_dtype,
            speculative=speculative,
        )
        tokenizer = engine.tokenizer
        if raw:
            ids = engine.encode(prompt)
        else:
            messages = [{"role": "system", "content": system}] if system is not None else []
            messages.append({"role": "user", "content": prompt})
            ids = tokenizer.encode_chat(messages)

        from pagedattn.cli.stream import format_stats, stream_request, warm_up

        warmup_s = warm_up(engine, ids[0]) if stats and ids else None
        try:
            result = stream_request(engine, ids, params, _write)
        finally:
            engine.close()  # the queued kv-store writes land before the process exits
        result.warmup_s = warmup_s
        _write("\n")
        if result.error:
            raise ValueError(result.error)
        if stats:
            print(format_stats(result), file=sys.stderr, flush=True)
