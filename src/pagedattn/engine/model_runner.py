"""ModelRunner: scheduled sequences -> ForwardBatch -> logits -> sampled token ids.

Position modes (DESIGN.md "Positions under eviction"): keys are always written with their
absolute RoPE positions. RoPE scores depend only on the query-key distance, so window keys
need nothing in either mode. In ``shifted`` mode (StreamingLLM, arXiv 2309.17453: positions
counted inside the cache) a query at absolute position ``p`` sits at in-cache position
``min(p, S + W - 1)`` once the window has moved past the sinks; sink keys keep their in-cache
positions ``0..S-1``, so the model scores sink keys with the query rotated to that in-cache
position (``ForwardBatch.sink_positions``) and everything matches a dense forward over exactly
the retained tokens at positions ``0..n-1``.

Logits rows: one per sampling sequence (its last new token), plus, for a sequence that asked for
prompt logprobs, one per new prompt token whose successor is a prompt token (row of position
``p`` gives the logprob of prompt token ``p + 1``). Ids past the tokenizer's vocabulary are
masked (:func:`mask_padded_vocab`) before logprobs and sampling.

A sequence with drafts (speculative decoding) runs as one decode row per token, step token
first (:mod:`pagedattn.engine.spec.verify`), each row a logits row; its step token is sampled
with the others, then its drafts are checked in position order
(:func:`pagedattn.engine.spec.acceptance.sample_run`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import numpy as np

from pagedattn.config import CacheConfig
from pagedattn.engine.logprobs import TokenLogprobs, log_softmax, token_logprobs
from pagedattn.engine.sampler import mask_padded_vocab, sample_each
from pagedattn.engine.sampler_output import SamplerOutput
from pagedattn.engine.scheduled_batch import ScheduledBatch, ScheduledSeq
from pagedattn.engine.spec.acceptance import AcceptedRun, sample_run
from pagedattn.engine.spec.verify import verify_rows
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
    """

    def __init__(
        self,
        model: Model,
        kv: Any,
        cache_config: CacheConfig,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Collection[int] = (),
    ) -> None:
        self.model = model
        self.kv = kv
        self.cache_config = cache_config
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(sorted(eos_token_ids))

    @staticmethod
    def prompt_rows(s: ScheduledSeq) -> range:
        """Positions of this step whose logits give prompt logprobs (empty unless asked)."""
        seq = s.seq
        if not seq.needs_prompt_logits:
            return range(0)
        return range(s.start, min(s.start + s.num_new_tokens, seq.num_prompt_tokens - 1))

    def build(self, batch: ScheduledBatch) -> ForwardBatch:
        """The ForwardBatch of a step (see :class:`ForwardBatch` for every array's layout).

        Raises:
            ValueError: an empty batch, or a slot_mapping whose length is not num_new_tokens.
        """
        if not batch.seqs:
            raise ValueError("build: expected at least one scheduled sequence, got none")
        input_ids, positions, slots = [], [], []
        query_start_loc = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        table_rows: list[int] = []  # page-table row of each ForwardBatch sequence
        for i, s in enumerate(batch.seqs):
            if s.draft_token_ids:  # one decode row per token, each a logits row
                v = verify_rows(s)
                input_ids.append(v.input_ids)
                positions.append(v.positions)
                slots.append(v.slot_mapping)
                first = query_start_loc[-1]
                query_start_loc.extend(range(first + 1, first + v.num_rows + 1))
                context_lens.extend(v.context_lens.tolist())
                logits_indices.extend(range(first, first + v.num_rows))
                table_rows.extend([i] * v.num_rows)
                continue
            table_rows.append(i)
            start, n = s.start, s.num_new_tokens
            if s.slot_mapping.shape != (n,):
                raise ValueError(
                    f"request {s.seq.request_id!r}: slot_mapping expected shape ({n},), "
                    f"got {s.slot_mapping.shape}"
                )
            input_ids.append(np.asarray(s.seq.token_ids[start : start + n], dtype=np.int64))
            positions.append(np.arange(start, start + n, dtype=np.int64))
            slots.append(s.slot_mapping.astype(np.int64, copy=False))
            query_start_loc.append(query_start_loc[-1] + n)
            context_lens.append(start + n)
            base = query_start_loc[-2] - start
            logits_indices.extend(base + p for p in self.prompt_rows(s))
            if s.samples:
                logits_indices.append(query_start_loc[-1] - 1)
        pos = np.concatenate(positions)
        cfg = self.cache_config
        sink_positions = None
        if cfg.position_mode == "shifted" and cfg.num_sink_tokens > 0:
            assert cfg.sliding_window is not None  # CacheConfig guarantees it
            sink_positions = np.minimum(pos, cfg.num_sink_tokens + cfg.sliding_window - 1)
        return ForwardBatch(
            input_ids=np.concatenate(input_ids),
            positions=pos,
            slot_mapping=np.concatenate(slots),
            query_start_loc=np.asarray(query_start_loc, dtype=np.int32),
            context_lens=np.asarray(context_lens, dtype=np.int32),
            page_tables=np.asarray(batch.page_tables, dtype=np.int32)[table_rows],
            logits_indices=np.asarray(logits_indices, dtype=np.int64),
            sliding_window=cfg.sliding_window,
            num_sink_tokens=cfg.num_sink_tokens,
            sink_positions=sink_positions,
        )

    def logits(self, batch: ScheduledBatch) -> np.ndarray:
        """(num sampling sequences, vocab) float32 logits of a step (runs the model once)."""
        return np.asarray(self.model.forward(self.build(batch), self.kv))

    def run(self, batch: ScheduledBatch) -> SamplerOutput:
        """Run one step: run the model, take prompt logprobs, sample one token per sample
        row (see :class:`SamplerOutput`).

        Returns:
            The step's SamplerOutput (a row that could not be sampled is in its ``errors``:
            that request fails alone); empty (and no model call) when nothing is scheduled.

        Raises:
            Whatever the model raises: the whole step failed.
        """
        if not batch.seqs:
            return SamplerOutput.empty()
        logits = self.logits(batch)
        if self.vocab_size is not None:
            logits = mask_padded_vocab(logits, self.vocab_size)
        prompt_logprobs: dict[int, tuple[int, list[TokenLogprobs]]] = {}
        sample_rows: list[int] = []
        row = 0
        for s in batch.seqs:
            positions = self.prompt_rows(s)
            if positions:
                ids = s.seq.token_ids
                num_top = s.seq.params.prompt_logprobs or 0
                # One row at a time: a float64 copy of every prompt row would double the memory.
                prompt_logprobs[s.seq.seq_id] = (
                    positions.start + 1,
                    [
                        token_logprobs(log_softmax(logits[row + j]), ids[p + 1], num_top)
                        for j, p in enumerate(positions)
                    ],
                )
                row += len(positions)
            if s.samples:
                sample_rows.extend([row] * (1 + len(s.seq.fork_children)))
                row += 1 + len(s.draft_token_ids)
        seqs = batch.sample_rows
        if not seqs:
            return SamplerOutput(np.zeros(0, dtype=np.int64), [], prompt_logprobs)
        rows = logits[np.asarray(sample_rows, dtype=np.int64)]
        token_ids, errors = sample_each(
            rows,
            [q.params for q in seqs],
            [q.generator for q in seqs],
            [q.output_token_ids for q in seqs],
            [q.prompt_token_ids for q in seqs],
            self.eos_token_ids,
        )
        logprobs: list[TokenLogprobs | None] = []
        cache: dict[int, np.ndarray] = {}
        for i, (q, r, t) in enumerate(zip(seqs, sample_rows, token_ids.tolist(), strict=True)):
            if not q.params.needs_logprob or i in errors:
                logprobs.append(None)
                continue
            if r not in cache:
                cache[r] = log_softmax(logits[r])
            logprobs.append(token_logprobs(cache[r], t, q.params.logprobs or 0))
        accepted = self._accept_drafts(batch, logits, sample_rows, token_ids, errors)
        return SamplerOutput(token_ids, logprobs, prompt_logprobs, errors, accepted)

    def _accept_drafts(
        self,
        batch: ScheduledBatch,
        logits: np.ndarray,
        sample_rows: list[int],
        token_ids: np.ndarray,
        errors: dict[int, str],
    ) -> dict[int, AcceptedRun]:
        """Per drafted sequence's sample row, the tokens its drafts' rows confirm."""
        accepted: dict[int, AcceptedRun] = {}
        i = 0
        for s in batch.seqs:
            if not s.samples:
                continue
            if s.draft_token_ids and i not in errors:
                first = int(token_ids[i])
                accepted[i] = sample_run(logits, sample_rows[i], first, s, self.eos_token_ids)
            i += 1 + len(s.seq.fork_children)
        return accepted
