"""The engine options as one value: :class:`EngineOptions`, and the engine it builds.

:class:`EngineOptions` is an option group (see :mod:`pagedattn.cli.option_groups`): each field
is one ``--flag`` of :mod:`pagedattn.cli.options`, its default the flag's default. `serve`
offers every field; `generate` and `chat` omit :data:`SERVER_OPTIONS`, which then keep their
defaults (the configs' own).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedattn.cli.options import (
    ActivationsOption,
    BackendOption,
    DeviceOption,
    DisableHybridKvOption,
    EngineSeedOption,
    KvCacheDtypeOption,
    KvCacheMibOption,
    KvStoreDeadlineOption,
    KvStoreKeyOption,
    KvStoreOption,
    LongPrefillTokenThresholdOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    ModelOption,
    NumPagesOption,
    PageSizeOption,
    PositionModeOption,
    PrefixCachingOption,
    SinksOption,
    SlidingWindowOption,
    SpeculativeOption,
)

if TYPE_CHECKING:
    from pagedattn.config import EngineConfig
    from pagedattn.engine.llm_engine import LLMEngine

#: Fields only `serve` offers: pool size, batching limits and the engine seed of a server.
SERVER_OPTIONS = (
    "num_pages",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "seed",
    "long_prefill_token_threshold",
)

#: Fields whose ``engine_config`` keyword is spelled otherwise (the rest share their name).
_CONFIG_NAMES = {
    "sinks": "num_sink_tokens",
    "prefix_caching": "enable_prefix_caching",
    "kv_store_deadline": "kv_store_deadline_s",
}


@dataclass(frozen=True)
class EngineOptions:
    """The engine options of one command line (in help order)."""

    model: ModelOption = None
    page_size: PageSizeOption = 16
    num_pages: NumPagesOption = None
    kv_cache_mib: KvCacheMibOption = 256.0
    sliding_window: SlidingWindowOption = 0
    sinks: SinksOption = 0
    position_mode: PositionModeOption = "absolute"
    prefix_caching: PrefixCachingOption = True
    disable_hybrid_kv_cache_manager: DisableHybridKvOption = False
    max_num_seqs: MaxNumSeqsOption = 64
    max_num_batched_tokens: MaxNumBatchedTokensOption = 2048
    max_model_len: MaxModelLenOption = None
    kv_store: KvStoreOption = None
    kv_store_key: KvStoreKeyOption = None
    kv_store_deadline: KvStoreDeadlineOption = 0.5
    backend: BackendOption = "numpy"
    device: DeviceOption = None
    activations: ActivationsOption = "float32"
    kv_cache_dtype: KvCacheDtypeOption = "float32"
    speculative: SpeculativeOption = "auto"
    seed: EngineSeedOption = 0
    long_prefill_token_threshold: LongPrefillTokenThresholdOption = None

    def engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`pagedattn.engine.llm.engine_config` (and of the
        server's ``build_app``) these options stand for, the model aside.

        Raises:
            ValueError: a negative ``--sliding-window``, naming the flag.
        """
        kwargs = {
            _CONFIG_NAMES.get(f.name, f.name): getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "model"
        }
        kwargs["sliding_window"] = window_or_none(self.sliding_window)
        return kwargs

    def engine_config(self) -> EngineConfig:
        """The EngineConfig of these options.

        Raises:
            ValueError: a value the configs reject.
        """
        from pagedattn.engine.llm import engine_config

        return engine_config(self.model, **self.engine_kwargs())

    def build_engine(self) -> LLMEngine:
        """Load the model and build its engine; on a terminal, say first when the kernels are
        about to compile (see :func:`kernels_cached`).

        Raises:
            ValueError: a value the configs reject; FileNotFoundError: a missing model;
            pagedattn.backends.BackendError: an invalid or missing backend / device.
        """
        from pagedattn.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_config(self.engine_config())
        if self.backend == "numpy" and sys.stderr.isatty() and not kernels_cached():
            print(COMPILE_NOTICE, file=sys.stderr, flush=True)
        return engine


def build_engine(model: str | None = None, **options: Any) -> LLMEngine:
    """The engine of ``EngineOptions(model=model, **options)`` (keywords: its fields)."""
    return EngineOptions(model=model, **options).build_engine()


COMPILE_NOTICE = (
    "compiling the kernels: the first run after an install or an edit of kernels/ or model/ "
    "takes a minute or two (on 2 cores, a second process compiles the decode layer); later runs "
    "load them from Numba's cache"
)


def kernels_cached() -> bool:
    """See :func:`pagedattn.engine.compile_helper.kernels_cached`."""
    from pagedattn.engine.compile_helper import kernels_cached as cached

    return cached()


def window_or_none(sliding_window: int) -> int | None:
    """``--sliding-window`` as the configs take it: 0 = None (no window).

    Raises:
        ValueError: a negative value, naming the flag.
    """
    if sliding_window < 0:
        raise ValueError(f"--sliding-window: expected an int >= 0 (0 = off), got {sliding_window}")
    return sliding_window or None
