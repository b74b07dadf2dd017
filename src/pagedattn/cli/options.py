"""Options shared by `pagedattn generate` and `pagedattn chat`, declared once.

Each option is an ``Annotated`` type a command uses as a parameter annotation; the builders
turn the parsed values into an engine and sampling parameters. Values are validated by the
configs themselves (``CacheConfig``, ``SamplingParams``) so that a bad value gives the same
one-line message from every entry point; :func:`cli_errors` prints it and exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.sampling_params import SamplingParams

ENGINE = "Engine"
SAMPLING = "Sampling"

# ---- engine ----------------------------------------------------------------------------------
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A .gguf file or a Hugging Face folder; default: the embedded SmolLM2-135M-Instruct.",
        rich_help_panel=ENGINE,
    ),
]
PageSizeOption = Annotated[int, typer.Option(help="Tokens per KV page.", rich_help_panel=ENGINE)]
KvCacheMibOption = Annotated[
    float, typer.Option(help="KV cache budget in MiB (float32 K and V).", rich_help_panel=ENGINE)
]
SlidingWindowOption = Annotated[
    int,
    typer.Option(
        help="Attend to the last W tokens only and free older pages; 0 = full attention.",
        rich_help_panel=ENGINE,
    ),
]
SinksOption = Annotated[
    int,
    typer.Option(
        "--sinks",
        help="Attention-sink tokens kept visible besides the window (needs --sliding-window).",
        rich_help_panel=ENGINE,
    ),
]
PositionModeOption = Annotated[
    str,
    typer.Option(
        help="'absolute' (keys keep their positions) or 'shifted' (positions inside the cache; "
        "needs --sliding-window).",
        rich_help_panel=ENGINE,
    ),
]
PrefixCachingOption = Annotated[
    bool,
    typer.Option(
        "--prefix-caching/--no-prefix-caching",
        help="Reuse cached KV pages of a matching prompt prefix.",
        rich_help_panel=ENGINE,
    ),
]
KvStoreOption = Annotated[
    str | None,
    typer.Option(
        "--kv-store",
        help="Persistent KV tier: a directory, or redis://HOST:PORT/DB. Full pages are written "
        "there and a later run (or another server) restores them instead of recomputing.",
        rich_help_panel=ENGINE,
    ),
]

# ---- sampling --------------------------------------------------------------------------------
MaxTokensOption = Annotated[
    int, typer.Option(help="Most tokens to generate.", rich_help_panel=SAMPLING)
]
TemperatureOption = Annotated[
    float,
    typer.Option(help="0 = greedy (reproducible); > 0 samples.", rich_help_panel=SAMPLING),
]
TopPOption = Annotated[
    float, typer.Option(help="Nucleus sampling mass in (0, 1].", rich_help_panel=SAMPLING)
]
TopKOption = Annotated[
    int, typer.Option(help="Keep the k most likely tokens; 0 = off.", rich_help_panel=SAMPLING)
]
SeedOption = Annotated[
    int | None,
    typer.Option(help="Random seed for sampling (temperature > 0).", rich_help_panel=SAMPLING),
]
IgnoreEosOption = Annotated[
    bool,
    typer.Option(
        "--ignore-eos", help="Keep generating past end-of-sequence.", rich_help_panel=SAMPLING
    ),
]
SystemOption = Annotated[str | None, typer.Option(help="System message for the chat template.")]
StatsOption = Annotated[
    bool,
    typer.Option(
        "--stats",
        help="Print prefill/decode tok/s, time to first token, peak pages and cached prompt "
        "tokens to stderr after each answer.",
    ),
]


def build_engine(
    model: str | None,
    *,
    page_size: int,
    kv_cache_mib: float,
    sliding_window: int,
    sinks: int,
    position_mode: str,
    prefix_caching: bool = True,
    kv_store: str | None = None,
) -> LLMEngine:
    """Load the model and build an engine from the shared engine options.

    Args:
        model: model path or None (the embedded model).
        page_size: tokens per page; kv_cache_mib: KV budget in MiB; sliding_window: W in
            tokens, 0 = none; sinks: sink tokens; position_mode: "absolute" or "shifted";
            prefix_caching: enable the prefix cache; kv_store: the persistent tier (a
            directory or redis://HOST:PORT/DB) or None.

    Raises:
        ValueError: a value the configs reject; FileNotFoundError: a missing model.
    """
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine

    if sliding_window < 0:
        raise ValueError(f"--sliding-window: expected an int >= 0 (0 = off), got {sliding_window}")
    config = engine_config(
        model,
        page_size=page_size,
        kv_cache_mib=kv_cache_mib,
        sliding_window=sliding_window or None,
        num_sink_tokens=sinks,
        position_mode=position_mode,
        enable_prefix_caching=prefix_caching,
        kv_store=kv_store,
    )
    return LLMEngine.from_config(config)


def build_sampling_params(
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    ignore_eos: bool,
) -> SamplingParams:
    """SamplingParams from the shared sampling options.

    Raises:
        ValueError: a value outside the ranges ``SamplingParams`` documents.
    """
    from pagedattn.sampling_params import SamplingParams

    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
    )


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn expected failures (bad values, missing model files) into one line on stderr and
    exit code 1, without a traceback. Ctrl-C exits 130."""
    try:
        yield
    except (ValueError, FileNotFoundError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        print("", file=sys.stderr, flush=True)
        raise typer.Exit(code=130) from None
