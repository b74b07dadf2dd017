"""LLMEngine: add requests, step the model, stream outputs (vLLM's ``LLMEngine`` shape).

Not thread-safe: one caller drives ``add_request`` / ``step`` / ``abort`` (a server runs them
on one loop). Its parts: :mod:`pagedattn.engine.engine_setup` checks the model against the
config and names and opens the pages' tiers, :mod:`pagedattn.engine.request_front_end` turns
a prompt into a request (``n`` / ``best_of`` > 1: child requests of a parent) and folds the
outputs, :mod:`pagedattn.engine.engine_stats` gathers the counters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence as SequenceABC
from typing import TYPE_CHECKING, Any

from pagedattn.config import EngineConfig, ModelConfig
from pagedattn.engine import engine_setup
from pagedattn.engine.engine_kv import build_engine_kv, group_snapshots
from pagedattn.engine.engine_stats import engine_stats
from pagedattn.engine.kv_groups import group_usage
from pagedattn.engine.model_runner import Model, ModelRunner
from pagedattn.engine.outputs import RequestOutput
from pagedattn.engine.request_builder import RequestBuilder
from pagedattn.engine.request_front_end import RequestFrontEnd
from pagedattn.engine.scheduler import Scheduler
from pagedattn.engine.step_output import StepOutput
from pagedattn.engine.step_plan import StepPlan
from pagedattn.engine.step_report import (
    StepCounters,
    StepResult,
    StepTimings,
    step_report,
)
from pagedattn.model.build import build_model, resolve_model_backend
from pagedattn.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedattn.storage import KVStore

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
        self.model_fingerprint = engine_setup.model_fingerprint_of(
            model, model_fingerprint, persistent=kv_store is not None or config.kv_store is not None
        )
        num_pages = cc.resolve_num_pages(mc)
        self.backend = engine_setup.check_model(config, model)
        self.namespace = engine_setup.engine_namespace(config, mc, self.model_fingerprint)
        kv = build_engine_kv(config, mc, num_pages, self.namespace, self.backend, kv_store)
        self.page_pool, self.kv_layout, self.kv_tier = kv.pool, kv.layout, kv.tier
        #: every persistent tier: one per layer group with a hybrid KV cache (``kv_tier`` is
        #: group 0's)
        self.kv_tiers = kv.tiers
        self.cache_manager = self.kv_layout.manager
        #: restores from the tier, read beside the steps (requests "waiting for KV")
        self.kv_restores = kv.restores
        eos = engine_setup.stop_token_ids(tokenizer, mc)
        max_len = engine_setup.max_model_len(cc, sc, mc)
        self.scheduler = Scheduler(
            cc, sc, self.cache_manager, eos, max_len, restores=self.kv_restores
        )
        # The tokenizer's vocabulary: logits of padded ids past it are masked.
        self.vocab_size: int = mc.vocab_size if tokenizer is None else int(tokenizer.vocab_size)
        self.runner = ModelRunner(
            model,
            self.page_pool.kv,
            cc,
            vocab_size=self.vocab_size,
            eos_token_ids=eos,
            layer_groups=self.kv_layout.layer_groups,
        )
        self._requests = RequestBuilder(tokenizer, self.vocab_size, max_len, config.seed)
        shared_page = cc.page_size if cc.enable_prefix_caching else None
        self._front = RequestFrontEnd(self.scheduler, self._requests, shared_page)

    def close(self) -> None:
        """Stop the tier's restores, finish its queued writes and close it (idempotent; no-op
        without one)."""
        if self.kv_restores is not None:
            self.kv_restores.close()
        for tier in self.kv_tiers:
            tier.close()

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
        return self._requests.encode(prompt)

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

        With ``params.n`` / ``best_of`` > 1 completion ``i`` is the child request
        ``f"{i}_{request_id}"`` drawing from ``make_generator(seed + i)`` (vLLM's rule),
        ``seed`` being ``params.seed`` or, when None, one draw from the engine's generator:
        completion ``i`` equals a solo request with ``seed=seed + i``
        (:mod:`pagedattn.engine.parent_request`).

        Raises:
            ValueError: a bad prompt (see :meth:`encode`), a request id (or a child's) already
                in use, or a ``logit_bias`` / ``stop_token_ids`` id outside the vocabulary.
        """
        return self._front.add(prompt, params, request_id, arrival_time)

    def step(self) -> StepResult:
        """Run one engine step: schedule, run the model once, apply the sampled tokens.

        Each phase commits or rolls back: a schedule that raises gives back what it
        reserved and the error propagates (the requests wait on, unchanged). A request
        restoring its prefix from the persistent tier waits for its KV beside the steps
        (:mod:`pagedattn.engine.kv_restores`); a step with nothing else to run waits for it
        a few milliseconds at most. A forward that raises fails only this
        step's requests (finish reason "error", the
        message in ``RequestOutput.error``); nothing they reserved enters the prefix cache.
        A row that fails alone (NaN logits, an undecodable token...) fails only its request.

        Returns:
            One RequestOutput per request that produced a token or finished this step; its
            ``outputs`` are deltas (only what is new since the request's previous output).
            The list's ``report`` (:class:`StepReport`) says what the step did: its phase
            timings, tokens, pages, prefix hits and preemptions.

        Raises:
            KeyboardInterrupt (and other non-``Exception`` errors) after failing the step's
            requests; their outputs come with the next step.
        """
        began = time.perf_counter()
        before = StepCounters.of(self.scheduler.stats, self.cache_manager)
        plan = self.scheduler.schedule()
        scheduled = time.perf_counter()
        pages_used = self.cache_manager.num_pages - self.cache_manager.allocator.num_free_pages
        group_bytes = tuple((g["name"], g["resident_bytes"]) for g in self.kv_group_usage())
        clock = self._requests.detokenize_clock
        try:
            out = self.runner.run(plan)
        except BaseException as exc:
            outputs = self._fail_step(plan, exc)
            out, ran, detokenized = StepOutput(), time.perf_counter(), clock.seconds
            failed = True
        else:
            ran, detokenized, failed = time.perf_counter(), clock.seconds, False
            outputs = self._front.route(self.scheduler.postprocess(plan, out))
        done = time.perf_counter()
        timings = StepTimings(
            schedule_s=scheduled - began,
            run=out.timings,
            postprocess_s=done - ran,
            detokenize_s=clock.seconds - detokenized,
            total_s=done - began,
        )
        counters = StepCounters.of(self.scheduler.stats, self.cache_manager)
        report = step_report(plan, counters.since(before), self.cache_manager.num_pages,
                             pages_used, timings, failed=failed)  # fmt: skip
        report = dataclasses.replace(report, kv_group_bytes=group_bytes)
        if not plan.requests and self.kv_restores is not None:
            self.kv_restores.idle_wait()  # nothing to run but restores: no busy loop
        return StepResult(outputs, report)

    def _fail_step(self, plan: StepPlan, exc: BaseException) -> list[RequestOutput]:
        """Fail the step's requests; re-raise ``exc`` unless it is an ``Exception``."""
        self.scheduler.fail_step(plan, f"engine step failed: {type(exc).__name__}: {exc}")
        if not isinstance(exc, Exception):
            raise exc
        logger.exception("engine step failed; %d request(s) failed", len(plan.request_ids))
        return self._front.route(self.scheduler.take_pending())

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; its pages are freed once; the next step returns its
        final output with finish reason "abort" (every completion's). Returns False for
        unknown/finished ids."""
        return self._front.abort(request_id)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix of the pool, as vLLM's ``reset_prefix_cache``; False (and
        nothing dropped) while a request is unfinished. The persistent tier keeps its pages."""
        if self.has_unfinished_requests():
            return False
        self.cache_manager.reset_prefix_cache()
        return True

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs, or has an output not yet returned by step()."""
        return self.scheduler.has_unfinished()

    def get_stats(self) -> dict[str, Any]:
        """Plain counters for metrics: see :func:`pagedattn.engine.engine_stats.engine_stats`,
        and ``kv_groups``: each layer group's pages
        (:func:`pagedattn.engine.kv_groups.group_usage`; one group when every layer keeps
        every page)."""
        stats = engine_stats(self.scheduler, self.cache_manager, self.kv_tier)
        stats["kv_groups"] = self.kv_group_usage()
        return stats

    def kv_group_usage(self) -> list[dict[str, Any]]:
        """Each layer group's pages now (:func:`pagedattn.engine.kv_groups.group_usage`)."""
        return group_usage(self.kv_layout, self.page_pool)

    def kv_snapshot(self, max_sequences: int = 256, max_table: int = 1024) -> dict[str, Any]:
        """The page pool as plain data, ids and counts only (never token ids): ``pool`` (a
        :class:`pagedattn.cache.pool_snapshot.PoolSnapshot` of the first ``max_sequences``
        running sequences, ``max_table`` entries each), ``sequences`` (their ``(request_id,
        seq_id, num_cached_tokens)``), ``num_running``, the pool's ``kv_dtype``,
        ``num_layers`` and ``bytes_per_page``, and ``stats`` (:meth:`get_stats` now); ``groups``:
        per layer group (one without a hybrid KV cache) its ``pool`` snapshot (its own page
        ids), ``first_layer``, ``num_layers`` and ``bytes_per_page``; the top-level ``pool``,
        ``num_layers`` and ``bytes_per_page`` are group 0's."""
        shown = self.scheduler.running[:max_sequences]
        pool = self.page_pool
        groups = group_snapshots(self.kv_layout, pool, [s.seq_id for s in shown], max_table)
        return {
            "pool": groups[0]["pool"],
            "groups": groups,
            "sequences": [(s.request_id, s.seq_id, s.num_cached_tokens) for s in shown],
            "num_running": len(self.scheduler.running),
            "kv_dtype": str(pool.dtype),
            "num_layers": groups[0]["num_layers"],
            "bytes_per_page": groups[0]["bytes_per_page"],
            "stats": self.get_stats(),
        }
