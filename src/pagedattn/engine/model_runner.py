"""ModelRunner: a StepPlan -> ForwardBatch -> logits -> a StepOutput keyed by request id.

Position modes (DESIGN.md "Positions under eviction"): keys are always written with their
absolute RoPE positions. RoPE scores depend only on the query-key distance, so window keys
need nothing in either mode. In ``shifted`` mode (StreamingLLM, arXiv 2309.17453: positions
counted inside the cache) a query at absolute position ``p`` sits at in-cache position
``min(p, S + W - 1)`` once the window has moved past the sinks; sink keys keep their in-cache
positions ``0..S-1``, so the model scores sink keys with the query rotated to that in-cache
position (``ForwardBatch.sink_positions``) and everything matches a dense forward over exactly
the retained tokens at positions ``0..n-1``.

The runner reads only the plan (:mod:`pagedattn.engine.step_plan`, where the logits rows are
laid out) and writes nothing but the KV of the step. Ids past the tokenizer's vocabulary are
masked (:func:`mask_padded_vocab`) before logprobs and sampling.

A sequence with drafts (speculative decoding) runs as one decode row per token, step token
first (:mod:`pagedattn.engine.spec.verify`), each row a logits row; its step token is sampled
with the others, then its drafts are checked in position order
(:func:`pagedattn.engine.spec.acceptance.sample_run`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from typing import Any, Protocol

import numpy as np

from pagedattn.config import CacheConfig
from pagedattn.engine.logprobs import log_softmax, token_logprobs
from pagedattn.engine.sampler import mask_padded_vocab, sample_each
from pagedattn.engine.spec.acceptance import sample_run
from pagedattn.engine.step_output import RequestStepOutput, RunTimings, SampledToken, StepOutput
from pagedattn.engine.step_plan import RequestPlan, SamplingState, StepPlan
from pagedattn.model.forward_batch import ForwardBatch


class Model(Protocol):
    """What the runner calls: ``pagedattn.model.llama.LlamaModel`` implements it."""

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray: ...


class ModelRunner:
    """Builds the ForwardBatch of a step, runs the model and samples.

    Args:
        model: the model; ``forward(batch, kv)`` returns float32 logits
            ``(len(batch.logits_indices), vocab)``.
        kv: the KV storage passed through to the model (the page pool).
        cache_config: page size, window, sinks and position mode.
        vocab_size: the tokenizer's vocabulary size; logits of ids at or past it (padded
            embedding rows) are masked. None = the whole logits row is vocabulary.
        eos_token_ids: end-of-sequence ids (masked while a request's ``min_tokens`` runs).
        layer_groups: the layer group of each model layer when the plan carries one
            :class:`~pagedattn.engine.step_plan.GroupKV` per group (a hybrid KV cache); None
            when every layer shares the page tables.
    """

    def __init__(
        self,
        model: Model,
        kv: Any,
        cache_config: CacheConfig,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Collection[int] = (),
        layer_groups: tuple[int, ...] | None = None,
    ) -> None:
        self.model = model
        self.kv = kv
        self.cache_config = cache_config
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.layer_groups = layer_groups

    def build(self, plan: StepPlan) -> ForwardBatch:
        """The ForwardBatch of a step (see :class:`ForwardBatch` for every array's layout):
        each request one query of its new tokens, a verifying request one one-token query per
        fed token; its logits rows are the plan's.

        Raises:
            ValueError: an empty plan.
        """
        if not plan.requests:
            raise ValueError("build: expected at least one scheduled request, got none")
        query_lens: list[int] = []
        context_lens: list[int] = []
        table_rows: list[int] = []  # the plan request of each ForwardBatch query
        for i, r in enumerate(plan.requests):
            if r.is_verify:
                rows = len(r.token_ids)
                query_lens.extend([1] * rows)
                context_lens.extend(range(r.start + 1, r.start + rows + 1))
                table_rows.extend([i] * rows)
            else:
                query_lens.append(r.num_new_tokens)
                context_lens.append(r.start + r.num_new_tokens)
                table_rows.append(i)
        pos = np.concatenate([r.positions for r in plan.requests])
        cfg = self.cache_config
        sink_positions = None
        if cfg.position_mode == "shifted" and cfg.num_sink_tokens > 0:
            assert cfg.sliding_window is not None  # CacheConfig guarantees it
            sink_positions = np.minimum(pos, cfg.num_sink_tokens + cfg.sliding_window - 1)
        groups = len(plan.requests[0].kv)
        tables, slots = [], []
        for g in range(groups):
            table = np.stack([r.kv[g].page_table for r in plan.requests]).astype(np.int32)
            tables.append(table[table_rows])
            slots.append(np.concatenate([r.kv[g].slot_mapping for r in plan.requests]))
        return ForwardBatch(
            input_ids=np.concatenate([r.token_ids for r in plan.requests]),
            positions=pos,
            slot_mapping=slots[0],
            query_start_loc=np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
            context_lens=np.asarray(context_lens, dtype=np.int32),
            page_tables=tables[0],
            logits_indices=plan.logits_indices,
            sliding_window=cfg.sliding_window,
            num_sink_tokens=cfg.num_sink_tokens,
            sink_positions=sink_positions,
            layer_groups=self.layer_groups if groups > 1 else None,
            group_kv=tuple(zip(slots[1:], tables[1:], strict=True)),
        )

    def logits(self, plan: StepPlan) -> np.ndarray:
        """(logits rows, vocab) float32 logits of a step (runs the model once)."""
        return np.asarray(self.model.forward(self.build(plan), self.kv))

    def _timed_logits(self, plan: StepPlan) -> tuple[np.ndarray, float, float]:
        """The step's logits, with the seconds of building its batch and of the forward."""
        t0 = time.perf_counter()
        batch = self.build(plan)
        t1 = time.perf_counter()
        logits = np.asarray(self.model.forward(batch, self.kv))
        return logits, t1 - t0, time.perf_counter() - t1

    def run(self, plan: StepPlan) -> StepOutput:
        """Run one step: run the model, take prompt logprobs, sample each request's token
        from its sample row, then the rows of its drafts.

        Returns:
            The step's output, one entry per planned request (a row that could not be sampled
            carries its ``error``: that request fails alone); empty (and no model call) when
            nothing is scheduled.

        Raises:
            Whatever the model raises: the whole step failed.
        """
        if not plan.requests:
            return StepOutput()
        logits, build_s, forward_s = self._timed_logits(plan)
        began = time.perf_counter()
        out = self._sample(plan, logits)
        timings = RunTimings(build_s, forward_s, time.perf_counter() - began)
        return dataclasses.replace(out, timings=timings)

    def _sample(self, plan: StepPlan, logits: np.ndarray) -> StepOutput:
        """Prompt logprobs, each request's token and its drafts' run, from the logits."""
        if self.vocab_size is not None:
            logits = mask_padded_vocab(logits, self.vocab_size)
        out = StepOutput({r.request_id: RequestStepOutput() for r in plan.requests})
        targets: list[tuple[RequestPlan, SamplingState]] = []
        for r in plan.requests:
            if r.rows.prompt:
                # One row at a time: a float64 copy of every prompt row would double the memory.
                out.requests[r.request_id].prompt_logprobs = (
                    r.prompt_first,
                    [
                        token_logprobs(log_softmax(logits[row]), t, r.num_prompt_logprobs)
                        for row, t in zip(r.rows.prompt, r.prompt_targets, strict=True)
                    ],
                )
            if r.sampling is not None:
                targets.append((r, r.sampling))
        if not targets:
            return out
        rows = [r.rows.sample for r, _ in targets]
        token_ids, errors = sample_each(
            logits[np.asarray(rows, dtype=np.int64)],
            [c.params for _, c in targets],
            [c.generator for _, c in targets],
            [c.output_token_ids for _, c in targets],
            [c.prompt_token_ids for _, c in targets],
            self.eos_token_ids,
        )
        for i, ((r, c), t) in enumerate(zip(targets, token_ids.tolist(), strict=True)):
            error = errors.get(i)
            logprobs = None
            row = r.rows.sample
            assert row is not None
            if c.params.needs_logprob and error is None:
                logprobs = token_logprobs(log_softmax(logits[row]), t, c.params.logprobs or 0)
            accepted = None
            if r.rows.drafts and error is None:
                accepted = sample_run(logits, r, c, t, self.eos_token_ids)
            out.requests[r.request_id].sample = SampledToken(t, logprobs, error, accepted)
        return out
