"""LLMEngine: add requests, step the model, stream outputs (vLLM's ``LLMEngine`` shape).

Not thread-safe: one caller drives ``add_request`` / ``step`` / ``abort`` (a server runs them
on one loop).
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
import uuid
from collections.abc import Sequence as SequenceABC
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedattn.cache import CacheManager, PagePool, cache_namespace
from pagedattn.config import EngineConfig, ModelConfig
from pagedattn.engine.fingerprint import weights_fingerprint
from pagedattn.engine.model_runner import Model, ModelRunner
from pagedattn.engine.outputs import RequestOutput
from pagedattn.engine.sampler import make_generator
from pagedattn.engine.scheduler import Scheduler
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.sequence_group import SequenceGroup
from pagedattn.model.build import build_model, model_backend, resolve_model_backend
from pagedattn.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedattn.storage import KVStore, KVTier

logger = logging.getLogger("pagedattn.engine")


class LLMEngine:
    """Continuous-batching generation over a paged KV cache.

    Args:
        config: cache, scheduler and seed configuration (``config.model`` is only used by
            :meth:`from_config`).
        model: the model (``pagedattn.model.llama.LlamaModel``); needs ``.config`` (ModelConfig)
            and ``forward(batch, kv)``.
        tokenizer: ``pagedattn.model.tokenizer.Tokenizer`` for text prompts, streamed text and
            its stop token ids; None = token-id prompts only, empty output text, and the model
            config's ``eos_token_id`` as the only end-of-sequence id.
        model_fingerprint: stable id of the weights, part of the prefix cache namespace; None
            = a digest of the model's config and weights
            (:func:`pagedattn.engine.fingerprint.weights_fingerprint`).
        kv_store: the persistent tier: a :class:`pagedattn.storage.KVStore`, or None to open
            ``config.kv_store`` (a directory or ``redis://``) when set. Full pages are written
            to it after the forward that filled them; a prefix-cache miss restores from it.

    The page pool lives on ``config.backend`` / ``config.device``; the model must run there
    too (its ``backend`` attribute; a model without one runs on NumPy).

    Raises:
        ValueError: a KV budget that holds no page; a kv_store without prefix caching; a model
            built for another backend than ``config``'s; a kv_store for a model whose weights
            cannot be digested and no ``model_fingerprint``.
        pagedattn.backends.BackendError: the backend's library or device is missing, or cupy.
    """

    def __init__(
        self,
        config: EngineConfig,
        model: Model,
        tokenizer: Any = None,
        *,
        model_fingerprint: str | None = None,
        kv_store: KVStore | None = None,
    ) -> None:
        mc: ModelConfig = model.config  # type: ignore[attr-defined]
        cc, sc = config.cache, config.scheduler
        self.config = config
        self.model_config = mc
        self.tokenizer = tokenizer
        if model_fingerprint is None:
            model_fingerprint = weights_fingerprint(model)
        if model_fingerprint is None:
            if kv_store is not None or config.kv_store is not None:
                raise ValueError(
                    "model_fingerprint: this model's weights cannot be digested to name its "
                    "pages in the kv_store; pass model_fingerprint (a digest of its weights)"
                )
            model_fingerprint = f"engine-private:{uuid.uuid4().hex}"  # shares with nobody
        self.model_fingerprint = model_fingerprint
        num_pages = cc.resolve_num_pages(mc)
        self.backend = resolve_model_backend(config.backend, config.device)
        if model_backend(model) != self.backend:
            raise ValueError(
                f"backend: the model runs on {model_backend(model)}, the engine config asks "
                f"for {self.backend}; build it with pagedattn.model.build.build_model"
            )
        if getattr(model, "activations", "float32") != config.activations:
            raise ValueError(
                f"activations: the model computes with {getattr(model, 'activations', 'float32')}"
                f", the engine config asks for {config.activations}"
            )
        self.page_pool = PagePool(
            mc.num_layers, num_pages, mc.num_kv_heads, cc.page_size, mc.head_dim,
            dtype=np.dtype(cc.kv_cache_dtype), backend=self.backend,
        )  # fmt: skip
        namespace = cache_namespace(
            model_fingerprint=model_fingerprint,
            dtype=cc.kv_cache_dtype,
            page_size=cc.page_size,
            num_layers=mc.num_layers,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            rope_theta=mc.rope_theta,
            rope_scaling=mc.rope_scaling_key,
            sliding_window=cc.sliding_window,
            num_sink_tokens=cc.num_sink_tokens,
            position_mode=cc.position_mode,
            activations=config.activations,
        )
        self.namespace = namespace
        self.kv_tier = self._open_tier(kv_store, config, namespace)
        self.cache_manager = CacheManager(
            num_pages,
            cc.page_size,
            namespace,
            sliding_window=cc.sliding_window,
            num_sink_tokens=cc.num_sink_tokens,
            enable_prefix_caching=cc.enable_prefix_caching,
            tier=self.kv_tier,
        )
        if tokenizer is not None:
            eos: frozenset[int] = frozenset(tokenizer.stop_token_ids)
        else:
            eos = frozenset() if mc.eos_token_id is None else frozenset({mc.eos_token_id})
        bounded = cc.position_mode == "absolute" and cc.sliding_window is None
        max_model_len = sc.max_model_len
        if max_model_len is None and bounded:
            max_model_len = mc.max_position_embeddings
        self.scheduler = Scheduler(
            cc, sc, self.cache_manager, eos, max_model_len, copy_pages=self.page_pool.copy_pages
        )
        # The tokenizer's vocabulary: logits of padded ids past it are masked.
        self.vocab_size: int = mc.vocab_size if tokenizer is None else int(tokenizer.vocab_size)
        self.runner = ModelRunner(
            model,
            self.page_pool.kv,
            cc,
            vocab_size=self.vocab_size,
            eos_token_ids=eos,
        )
        self._decode_token = (
            None if tokenizer is None else functools.lru_cache(maxsize=65536)(self._decode_one)
        )
        self._special_ids = self._special_token_ids()
        self._rng = np.random.default_rng(config.seed)
        self._seq_ids = itertools.count()

    def _open_tier(
        self, store: KVStore | None, config: EngineConfig, namespace: bytes
    ) -> KVTier | None:
        if store is None and config.kv_store is None:
            return None
        if not config.cache.enable_prefix_caching:
            raise ValueError("kv_store: needs prefix caching (pages are named by prefix hash)")
        from pagedattn.storage import KVTier, open_store

        if store is None:
            assert config.kv_store is not None
            pool = self.page_pool
            page_shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
            store = open_store(
                config.kv_store, namespace, page_shape, pool.dtype, key=config.kv_store_key
            )
        return KVTier(store, self.page_pool, lookup_deadline_s=config.kv_store_deadline_s)

    def close(self) -> None:
        """Finish queued tier writes and close the tier (idempotent; no-op without one)."""
        if self.kv_tier is not None:
            self.kv_tier.close()

    @classmethod
    def from_config(cls, config: EngineConfig | None = None) -> LLMEngine:
        """Load ``config.model`` (None = the embedded SmolLM2) and build an engine on it.

        Raises:
            FileNotFoundError, ValueError: from :func:`pagedattn.model.loader.load_model`.
            pagedattn.backends.BackendError: see :func:`resolve_model_backend`.
        """
        from pagedattn.model.loader import load_model

        config = EngineConfig() if config is None else config
        spec = resolve_model_backend(config.backend, config.device)  # fail before loading
        loaded = load_model(config.model)
        model = build_model(loaded, spec, activations=config.activations)
        return cls(config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint)

    # ---- requests --------------------------------------------------------------------------
    def encode(self, prompt: str | SequenceABC[int]) -> list[int]:
        """Prompt token ids (text goes through the tokenizer).

        Raises:
            ValueError: text without a tokenizer, an empty prompt, or an id outside the vocab.
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: text needs a tokenizer; pass token ids instead")
            ids = [int(t) for t in self.tokenizer.encode(prompt)]
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt: expected at least one token, got none")
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt: token ids must be in [0, {vocab}), got {bad[:5]}")
        return ids

    def add_request(
        self,
        prompt: str | SequenceABC[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request; its outputs come from later :meth:`step` calls.

        Args:
            prompt: text, or token ids.
            params: sampling parameters (default ``SamplingParams()``).
            request_id: unique id; None = a fresh uuid4 hex.
            arrival_time: ``time.monotonic()`` when the request arrived (a server stamps it
                on receipt, so TTFT and e2e latency include queueing); None = now.

        Returns:
            The request id. A request that can never run (see ``Scheduler.add``) is still
            accepted here and finishes at the next step with a rejection finish reason.

        Completion ``i`` (of ``params.n`` / ``best_of``) draws from
        ``make_generator(seed + i)`` (vLLM's rule), ``seed`` being ``params.seed`` or, when
        None, one draw from the engine's generator: completion ``i`` equals a solo request with
        ``seed=seed + i``.

        Raises:
            ValueError: a bad prompt (see :meth:`encode`), a request id already in use, or a
                ``logit_bias`` / ``stop_token_ids`` id outside the tokenizer's vocabulary.
        """
        params = SamplingParams() if params is None else params
        request_id = uuid.uuid4().hex if request_id is None else request_id
        ids = self.encode(prompt)
        params.check_vocab(self.vocab_size)
        seed = params.seed if params.seed is not None else int(self._rng.integers(2**63))
        special_stops = {self._special_ids[s]: s for s in params.stop if s in self._special_ids}
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs: list[Sequence] = []
        for i in range(params.num_completions):
            text_stream = None
            if self.tokenizer is not None:
                from pagedattn.model.detokenizer import IncrementalDetokenizer

                text_stream = IncrementalDetokenizer(
                    self.tokenizer,
                    skip_special_tokens=params.skip_special_tokens,
                    prompt_token_ids=ids,
                )
            seqs.append(
                Sequence(
                    seq_id=next(self._seq_ids),
                    request_id=request_id,
                    prompt_token_ids=ids,
                    params=params,
                    generator=make_generator(seed + i),
                    arrival_time=arrival,
                    text_stream=text_stream,
                    max_model_len=self.scheduler.max_model_len,
                    prompt=prompt if isinstance(prompt, str) else None,
                    index=i,
                    decode_token=self._decode_token,
                    special_stops=special_stops,
                    metrics=seqs[0].metrics if seqs else None,
                )
            )
        self.scheduler.add(SequenceGroup(seqs))
        return request_id

    def _decode_one(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    def _special_token_ids(self) -> dict[str, int]:
        """Special-token text -> id (a stop string equal to one stops on that token)."""
        backend = getattr(self.tokenizer, "backend", None)
        if backend is None:
            return {}
        return {
            tok.content: int(i)
            for i, tok in backend.get_added_tokens_decoder().items()
            if tok.special
        }

    def step(self) -> list[RequestOutput]:
        """Run one engine step: schedule, run the model once, apply the sampled tokens.

        Each phase commits or rolls back: a schedule that raises gives back what it
        reserved and the error propagates (the requests wait on, unchanged); a store that
        raises during a lookup is a prefix-cache miss. A forward that raises fails only this
        step's requests (finish reason "error", the
        message in ``RequestOutput.error``); nothing they reserved enters the prefix cache.
        A row that fails alone (NaN logits, an undecodable token...) fails only its request.

        Returns:
            One RequestOutput per request that produced a token or finished this step; its
            ``outputs`` are deltas (only what is new since the request's previous output).

        Raises:
            KeyboardInterrupt (and other non-``Exception`` errors) after failing the step's
            requests; their outputs come with the next step.
        """
        if self.kv_tier is not None:
            self.kv_tier.begin_step()  # this step's lookups share one deadline
        batch = self.scheduler.schedule()
        try:
            sampled = self.runner.run(batch)
        except BaseException as exc:
            self.scheduler.fail_step(batch, f"engine step failed: {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise
            logger.exception("engine step failed; %d request(s) failed", len(batch.seqs))
            return self.scheduler.take_pending()
        return self.scheduler.postprocess(batch, sampled)

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; its pages are freed once; the next step returns its
        final output with finish reason "abort". Returns False for unknown/finished ids."""
        return self.scheduler.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs, or has an output not yet returned by step()."""
        return self.scheduler.has_unfinished()

    def get_stats(self) -> dict[str, Any]:
        """Plain counters for metrics (see :class:`pagedattn.engine.stats.SchedulerStats`).

        Keys: every SchedulerStats field, ``num_running``, ``num_waiting``, ``num_pages``,
        ``num_free_pages``, ``kv_cache_usage`` (fraction of pages referenced), and
        ``evictions`` (dict reason -> count from the cache manager), ``tier_restored_tokens``
        (prompt tokens restored from the persistent tier), ``tier_errors`` (dict: "lookup"
        lookups that raised and were a miss, "write" pages whose write-through raised) and
        ``kv_store`` (the tier's
        :meth:`pagedattn.storage.KVTier.stats`, None without a tier), and
        ``spec_acceptance_ratio`` (speculative decoding: accepted / drafted tokens, 0.0 before
        any draft).
        """
        s = self.scheduler.stats
        drafted = s.spec_num_drafted_tokens
        pages = self.cache_manager.num_pages
        referenced = pages - self.cache_manager.allocator.num_free_pages
        return {
            **{k: (dict(v) if k == "num_finished" else v) for k, v in vars(s).items()},
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_pages": pages,
            "num_free_pages": self.cache_manager.num_free_pages,
            "kv_cache_usage": referenced / pages,
            "evictions": self.cache_manager.evictions,
            "tier_restored_tokens": self.cache_manager.tier_restored_tokens,
            "tier_errors": dict(self.cache_manager.tier_errors),
            "kv_store": None if self.kv_tier is None else self.kv_tier.stats(),
            "spec_acceptance_ratio": s.spec_num_accepted_tokens / drafted if drafted else 0.0,
        }
