"""Options shared by `pagedattn generate`, `chat`, `serve` (and `demo`), declared once.

Each option is an ``Annotated`` type a command uses as a parameter annotation; the builders
turn the parsed values into an engine and sampling parameters. Names follow the option table
of the design notes (``--sliding-window 0`` = no window everywhere, ``--sinks``,
``--position-mode``, ``--num-pages`` over ``--kv-cache-mib``...). Values are validated by the
configs themselves (``CacheConfig``, ``SamplingParams``) so that a bad value gives the same
one-line message from every entry point; :func:`cli_errors` prints it with the config field
replaced by its flag (``CacheConfig.page_size`` -> ``--page-size``) and exits 1. Help shows
placeholders such as ``N`` or ``PATH`` (flags none), not typer's ``<int>``.
"""

from __future__ import annotations

import re
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
        metavar="PATH",
        help="A .gguf file or a Hugging Face folder; default: the embedded SmolLM2-135M-Instruct.",
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
        help="The most one engine step waits on --kv-store lookups; pages not fetched by then "
        "are recomputed (and counted).",
        rich_help_panel=ENGINE,
    ),
]
SpeculativeOption = Annotated[
    str | None,
    typer.Option(
        "--speculative",
        metavar="METHOD",
        help="Speculative decoding: ngram drafts tokens from the request's own prompt and "
        "output, verified in the same step; the output is bitwise the same. Off when absent.",
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
        help="How the 4-bit projections meet their inputs: float32 (exact, the default) or int8 "
        "(quantized per 32-input block, as llama.cpp does: faster decoding, not exact; numpy "
        "backend, AVX2).",
        rich_help_panel=ENGINE,
    ),
]
KvCacheDtypeOption = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        metavar="float32|float16",
        help="Storage of the KV pool: float32 (exact, the default) or float16 (half the memory "
        "per token and per decode step, rounded to nearest-even, as llama.cpp's KV cache; numpy "
        "backend).",
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

# ---- sampling --------------------------------------------------------------------------------
MaxTokensOption = Annotated[
    int, typer.Option(metavar="N", help="Most tokens to generate.", rich_help_panel=SAMPLING)
]
TemperatureOption = Annotated[
    float,
    typer.Option(
        metavar="T", help="0 = greedy (reproducible); > 0 samples.", rich_help_panel=SAMPLING
    ),
]
TopPOption = Annotated[
    float,
    typer.Option(metavar="P", help="Nucleus sampling mass in (0, 1].", rich_help_panel=SAMPLING),
]
TopKOption = Annotated[
    int,
    typer.Option(
        metavar="K", help="Keep the k most likely tokens; 0 = off.", rich_help_panel=SAMPLING
    ),
]
SeedOption = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Random seed for sampling (temperature > 0).",
        rich_help_panel=SAMPLING,
    ),
]
IgnoreEosOption = Annotated[
    bool,
    typer.Option(
        "--ignore-eos",
        metavar="",
        help="Keep generating past end-of-sequence.",
        rich_help_panel=SAMPLING,
    ),
]
SystemOption = Annotated[
    str | None, typer.Option(metavar="TEXT", help="System message for the chat template.")
]
StatsOption = Annotated[
    bool,
    typer.Option(
        "--stats",
        metavar="",
        help="Print prefill/decode tok/s, time to first token, peak pages and cached prompt "
        "tokens to stderr after each answer; a warm-up request first loads or compiles the "
        "kernels, timed apart, so the figures are steady-state.",
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
    kv_store_key: str | None = None,
    kv_store_deadline_s: float = 0.5,
    backend: str = "numpy",
    device: str | None = None,
    activations: str = "float32",
    kv_cache_dtype: str = "float32",
    speculative: str | None = None,
) -> LLMEngine:
    """Load the model and build an engine from the shared engine options.

    Args:
        model: model path or None (the embedded model).
        page_size: tokens per page; kv_cache_mib: KV budget in MiB; sliding_window: W in
            tokens, 0 = none; sinks: sink tokens; position_mode: "absolute" or "shifted";
            prefix_caching: enable the prefix cache; kv_store: the persistent tier (a
            directory or redis://HOST:PORT/DB) or None; kv_store_key: its shared signing
            secret or None; kv_store_deadline_s: the most a step waits on it; backend,
            device: the array backend (:mod:`pagedattn.backends`); activations: ``float32``
            or ``int8``; kv_cache_dtype: ``float32`` or ``float16``; speculative: None or
            ``ngram``.

    Raises:
        ValueError: a value the configs reject; FileNotFoundError: a missing model;
        pagedattn.backends.BackendError: an invalid or missing backend / device.
    """
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine

    config = engine_config(
        model,
        page_size=page_size,
        kv_cache_mib=kv_cache_mib,
        sliding_window=window_or_none(sliding_window),
        num_sink_tokens=sinks,
        position_mode=position_mode,
        enable_prefix_caching=prefix_caching,
        kv_store=kv_store,
        kv_store_key=kv_store_key,
        kv_store_deadline_s=kv_store_deadline_s,
        backend=backend,
        device=device,
        activations=activations,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
    )
    engine = LLMEngine.from_config(config)
    if backend == "numpy" and sys.stderr.isatty() and not kernels_cached():
        print(COMPILE_NOTICE, file=sys.stderr, flush=True)
    return engine


COMPILE_NOTICE = (
    "compiling the kernels: the first run after an install or an edit of kernels/ or model/ "
    "takes a few minutes (about 3 on 2 cores); later runs load them from Numba's cache"
)


def kernels_cached() -> bool:
    """False when Numba's cache lacks the fused decode layer for today's sources (no index
    file, or one stamped for other sources: see :mod:`pagedattn.kernels.numba_cache`), i.e. the
    first request will compile every kernel; True when it is there, or when Numba's private
    cache API (``_cache._cache_file._load_index``) is not as expected."""
    from pagedattn.model.decode_layer import decode_layer

    try:
        return bool(decode_layer._cache._cache_file._load_index())  # type: ignore[attr-defined]
    except Exception:  # a private API: unknown means "say nothing"
        return True


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


def window_or_none(sliding_window: int) -> int | None:
    """``--sliding-window`` as the configs take it: 0 = None (no window).

    Raises:
        ValueError: a negative value, naming the flag.
    """
    if sliding_window < 0:
        raise ValueError(f"--sliding-window: expected an int >= 0 (0 = off), got {sliding_window}")
    return sliding_window or None


# config field -> the flag that sets it (messages name what the user typed)
FLAGS = {
    "page_size": "--page-size",
    "num_pages": "--num-pages",
    "kv_cache_mib": "--kv-cache-mib",
    "kv_cache_dtype": "--kv-cache-dtype",
    "sliding_window": "--sliding-window",
    "num_sink_tokens": "--sinks",
    "position_mode": "--position-mode",
    "enable_prefix_caching": "--prefix-caching",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "speculative": "--speculative",
    "seed": "--seed",
    "model": "--model",
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "kv_store": "--kv-store",
    "kv_store_key": "--kv-store-key",
    "kv_store_deadline_s": "--kv-store-deadline",
}
_CONFIG_FIELD = re.compile(r"\b(?:CacheConfig|SchedulerConfig|EngineConfig)\.(\w+)")
_LEADING_FIELD = re.compile(r"^(\w+):")


def flag_message(message: str) -> str:
    """``message`` with config field names replaced by their flags: ``CacheConfig.page_size``
    -> ``--page-size``, a leading ``temperature:`` -> ``--temperature:``; values that the
    configs spell differently are noted (``sliding_window ... None`` means 0)."""
    message = _CONFIG_FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(0)), message)
    message = _LEADING_FIELD.sub(lambda m: f"{FLAGS.get(m.group(1), m.group(1))}:", message)
    return message.replace("needs sliding_window (got None)", "needs --sliding-window > 0")


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn expected failures (bad values, missing model files) into one line on stderr (config
    fields named by their flags, see :func:`flag_message`) and exit code 1, without a
    traceback; a backend or device that is invalid or missing exits 2. Ctrl-C exits 130."""
    from pagedattn.backends import BackendError

    try:
        yield
    except BackendError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        raise typer.Exit(code=2) from None
    except (ValueError, FileNotFoundError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        message = flag_message(message)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        print("", file=sys.stderr, flush=True)
        raise typer.Exit(code=130) from None
