"""The engine options of `pagedattn generate`, `chat`, `serve` (and the bench commands).

Each option is an ``Annotated`` type that a command, or a field of
:class:`pagedattn.cli.engine_options.EngineOptions`, uses as an annotation. Names follow the
option table of the design notes (``--sliding-window 0`` = no window everywhere, ``--sinks``,
``--position-mode``, ``--num-pages`` over ``--kv-cache-mib``...). Help shows placeholders such
as ``N`` or ``PATH`` (flags none), not typer's ``<int>``. The configs validate the values (see
:mod:`pagedattn.cli.errors` for how their messages reach the user).
"""

from __future__ import annotations

from typing import Annotated

import typer

ENGINE = "Engine"

# ---- engine ----------------------------------------------------------------------------------
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="NAME|PATH",
        help="A model name from `pagedattn models`, a .gguf file or a Hugging Face folder;"
        " default: the embedded SmolLM2-135M-Instruct.",
        rich_help_panel=ENGINE,
    ),
]
PageSizeOption = Annotated[
    int, typer.Option(metavar="N", help="Tokens per KV page.", rich_help_panel=ENGINE)
]
KvCacheMibOption = Annotated[
    float,
    typer.Option(
        metavar="MIB",
        help="KV cache budget in MiB (K and V, in --kv-cache-dtype).",
        rich_help_panel=ENGINE,
    ),
]
NumPagesOption = Annotated[
    int | None,
    typer.Option(
        metavar="N", help="Pages in the KV pool (wins over --kv-cache-mib).", rich_help_panel=ENGINE
    ),
]
SlidingWindowOption = Annotated[
    int,
    typer.Option(
        metavar="W",
        help="Attend to the last W tokens only and free older pages; 0 = full attention.",
        rich_help_panel=ENGINE,
    ),
]
SinksOption = Annotated[
    int,
    typer.Option(
        "--sinks",
        metavar="S",
        help="Attention-sink tokens kept visible besides the window (needs --sliding-window).",
        rich_help_panel=ENGINE,
    ),
]
PositionModeOption = Annotated[
    str,
    typer.Option(
        metavar="absolute|shifted",
        help="'absolute' (keys keep their positions) or 'shifted' (positions inside the cache; "
        "needs --sliding-window).",
        rich_help_panel=ENGINE,
    ),
]
DisableHybridKvOption = Annotated[
    bool,
    typer.Option(
        "--disable-hybrid-kv-cache-manager",
        help="Keep every layer's KV pages on a model with sliding-window layers (Gemma 3), "
        "instead of only the pages each layer's window still sees: the same text, more memory.",
        rich_help_panel=ENGINE,
    ),
]
PrefixCachingOption = Annotated[
    bool,
    typer.Option(
        "--prefix-caching/--no-prefix-caching",
        metavar="",
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
KvStoreKeyOption = Annotated[
    str | None,
    typer.Option(
        "--kv-store-key",
        envvar="PAGEDATTN_KV_STORE_KEY",
        show_envvar=True,
        metavar="SECRET",
        help="Shared secret (16+ bytes) that signs every --kv-store record (HMAC-SHA256); "
        "unsigned or wrongly signed records are refused. Without it, whoever can write the "
        "store decides what KV is restored.",
        rich_help_panel=ENGINE,
    ),
]
KvStoreDeadlineOption = Annotated[
    float,
    typer.Option(
        "--kv-store-deadline",
        metavar="SECONDS",
        help="The most a restore from --kv-store may take (the request waits for its KV, "
        "the others run on); pages not fetched by then are recomputed (and counted).",
        rich_help_panel=ENGINE,
    ),
]
SpeculativeOption = Annotated[
    str,
    typer.Option(
        "--speculative",
        metavar="auto|ngram|none",
        help="Speculative decoding: ngram drafts tokens from the request's own prompt and "
        "output, verified in the same step (the output is bitwise the same), each request "
        "only while its acceptance pays; auto (the default) is ngram where it is lossless "
        "(numpy backend, no sliding window); none turns it off.",
        rich_help_panel=ENGINE,
    ),
]
BackendOption = Annotated[
    str,
    typer.Option(
        "--backend",
        metavar="numpy|torch|cupy",
        help="Array backend of the model and KV pool: numpy (NumPy + Numba, the default) or "
        "torch (cupy serves KVStream and the kernels only).",
        rich_help_panel=ENGINE,
    ),
]
ActivationsOption = Annotated[
    str,
    typer.Option(
        "--activations",
        metavar="float32|int8",
        help="How the block-quantized projections meet their inputs: float32 (exact, the default) "
        "or int8 (quantized per 32-input block, as llama.cpp does: faster, not exact; numpy "
        "backend, AVX2).",
        rich_help_panel=ENGINE,
    ),
]
KvCacheDtypeOption = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        metavar="float32|float16|int8",
        help="Storage of the KV pool: float32 (exact, the default), float16 (half the memory "
        "per token and per decode step, rounded to nearest-even, as llama.cpp's KV cache) or "
        "int8 (about a quarter: int8 codes and a float32 scale per token and KV head); numpy "
        "backend.",
        rich_help_panel=ENGINE,
    ),
]
DeviceOption = Annotated[
    str | None,
    typer.Option(
        "--device",
        metavar="cpu|cuda",
        help="Device of the backend; default: cpu (numpy, torch), cuda (cupy).",
        rich_help_panel=ENGINE,
    ),
]
MaxNumSeqsOption = Annotated[
    int, typer.Option(metavar="N", help="Most sequences per step.", rich_help_panel=ENGINE)
]
MaxNumBatchedTokensOption = Annotated[
    int, typer.Option(metavar="N", help="Token budget of one step.", rich_help_panel=ENGINE)
]
MaxModelLenOption = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Most tokens per request; default: the model context.",
        rich_help_panel=ENGINE,
    ),
]
EngineSeedOption = Annotated[
    int,
    typer.Option(metavar="N", help="Engine seed for unseeded requests.", rich_help_panel=ENGINE),
]
LongPrefillTokenThresholdOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        metavar="N",
        help="Prefill chunk: most prompt tokens one request computes per step.",
        rich_help_panel=ENGINE,
    ),
]
