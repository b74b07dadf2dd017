"""StepPlan: the scheduler's decision for one step, frozen, handed to the model runner.

The plan is the whole hand-off from the scheduler to the runner: per scheduled request its id,
the token ids, positions and KV slots its forward writes, its page table, which logits rows the
step needs from it and how to sample them. It holds no live engine object: the runner reads
only the plan and returns a :class:`~pagedattn.engine.step_output.StepOutput` keyed by request
id, which :class:`~pagedattn.engine.step_postprocess.StepPostprocessor` applies after the step
succeeded.

Logits rows are laid out once, by :func:`build_plan`: scheduled requests in batch order, each
with its prompt-logprob rows (one per new prompt token whose successor is a prompt token), then
its sample row (the last new token), then one row per draft (speculative decoding).
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

import numpy as np

from pagedattn.engine.scheduled_batch import ScheduledSeq
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.spec.verify import verify_rows
from pagedattn.sampling_params import SamplingParams


@dataclass(frozen=True)
class GroupKV:
    """A request's KV addresses in one layer group (every layer, or with a hybrid KV cache the
    layers of one attention type: :mod:`pagedattn.cache.layer_groups`).

    Attributes:
        slot_mapping: (num rows,) int64 KV slot of each token the step feeds.
        page_table: (max_pages_per_seq,) int32 page ids in position order, -1 padded/evicted.
    """

    slot_mapping: np.ndarray
    page_table: np.ndarray


@dataclass(frozen=True)
class SamplingState:
    """What sampling a request's next token reads.

    Attributes:
        params: its sampling parameters.
        generator: its random generator (advanced by the draw).
        output_token_ids: its generated tokens so far (penalties, min_tokens, processors).
        prompt_token_ids: its prompt.
    """

    params: SamplingParams
    generator: np.random.Generator
    output_token_ids: tuple[int, ...]
    prompt_token_ids: SequenceABC[int]


@dataclass(frozen=True)
class LogitsRows:
    """A request's rows of the step's logits.

    Attributes:
        prompt: rows giving the prompt logprobs of positions ``prompt_first ..`` (row ``j``
            is position ``prompt_first + j - 1``'s logits).
        sample: the row its next token is sampled from, None when the step does not reach
            the end of the sequence (a mid-prompt chunk, a ``max_tokens=0`` request).
        drafts: one row per draft, after ``sample``: row of draft ``j`` gives the token after it.
    """

    prompt: range
    sample: int | None
    drafts: range


@dataclass(frozen=True)
class RequestPlan:
    """One scheduled request's share of a step.

    Attributes:
        request_id: the request's id.
        start: position of its first new token (its computed tokens before the step).
        num_new_tokens: tokens whose K/V the step computes (drafts not counted), >= 1.
        token_ids: (rows,) int64 the tokens fed: the new tokens, then the drafts.
        positions: (rows,) int64 their positions.
        kv: per layer group its slots and page table.
        draft_token_ids: tokens drafted after the sequence's last token; when non-empty every
            fed token is its own one-token decode query (:mod:`pagedattn.engine.spec.verify`).
        rows: its logits rows.
        prompt_first: position of the first prompt token the prompt rows score.
        prompt_targets: the prompt tokens the prompt rows score, in order.
        num_prompt_logprobs: top logprobs asked per prompt position (0 when none asked).
        sampling: what sampling ``rows.sample`` reads; None when ``rows.sample`` is None.
    """

    request_id: str
    start: int
    num_new_tokens: int
    token_ids: np.ndarray
    positions: np.ndarray
    kv: tuple[GroupKV, ...]
    draft_token_ids: tuple[int, ...]
    rows: LogitsRows
    prompt_first: int
    prompt_targets: tuple[int, ...]
    num_prompt_logprobs: int
    sampling: SamplingState | None

    @property
    def is_verify(self) -> bool:
        """True when it verifies drafts (each fed token a one-token decode query)."""
        return bool(self.draft_token_ids)


@dataclass(frozen=True)
class StepPlan:
    """Everything the runner needs for one step.

    Attributes:
        requests: the scheduled sequences' shares, in batch order.
        logits_indices: (num logits rows,) int64: the fed token (step-wide, batch order)
            whose logits each row is.
    """

    requests: tuple[RequestPlan, ...]
    logits_indices: np.ndarray

    @property
    def num_tokens(self) -> int:
        """New tokens of the step, drafts not counted."""
        return sum(r.num_new_tokens for r in self.requests)

    @property
    def num_draft_tokens(self) -> int:
        """Drafted tokens the step verifies (each one more decode row)."""
        return sum(len(r.draft_token_ids) for r in self.requests)

    @property
    def num_sampled(self) -> int:
        """Tokens the step samples from its sample rows (one per request that samples)."""
        return sum(r.rows.sample is not None for r in self.requests)

    @property
    def request_ids(self) -> list[str]:
        """The scheduled requests' ids, each once, in batch order."""
        return list(dict.fromkeys(r.request_id for r in self.requests))


def prompt_positions(item: ScheduledSeq) -> range:
    """Positions of this step whose logits give prompt logprobs (empty unless asked)."""
    seq = item.seq
    if not seq.needs_prompt_logits:
        return range(0)
    start = item.start
    return range(start, min(start + item.num_new_tokens, seq.num_prompt_tokens - 1))


def sampling_state(seq: Sequence) -> SamplingState:
    """The sampling state of ``seq``'s next token, as of now."""
    return SamplingState(
        seq.params, seq.generator, tuple(seq.output_token_ids), seq.prompt_token_ids
    )


def group_slots(table: np.ndarray, positions: np.ndarray, page_size: int) -> np.ndarray:
    """(rows,) int64 slots of ``positions`` in a group's page table ``table``.

    Raises:
        ValueError: a position whose page the table does not hold.
    """
    index = positions // page_size
    if index.size and (index.max() >= table.shape[0] or (table[index] < 0).any()):
        raise ValueError(f"group page table holds no page for positions {positions.tolist()}")
    out: np.ndarray = table[index].astype(np.int64) * page_size + positions % page_size
    return out


def build_plan(
    scheduled: SequenceABC[ScheduledSeq],
    page_tables: SequenceABC[np.ndarray],
    page_size: int | None = None,
) -> StepPlan:
    """Freeze the scheduler's step into a plan; the one place logits rows are laid out.

    Args:
        scheduled: the step's scheduled sequences, in batch order.
        page_tables: per layer group, (len(scheduled), max_pages_per_seq) int32 page tables.
            Group 0's slots are the ones reserved (``ScheduledSeq.slot_mapping``); another
            group's follow from its page table and the fed positions.
        page_size: tokens per page; needed with more than one group.

    Raises:
        ValueError: a slot mapping whose length is not its sequence's new tokens, page
            tables with another number of rows, or several groups without ``page_size``.
    """
    if len(page_tables) > 1 and page_size is None:
        raise ValueError("build_plan: several layer groups need page_size")
    for g, table in enumerate(page_tables):
        if table.shape[0] != len(scheduled):
            raise ValueError(
                f"page_tables[{g}]: expected {len(scheduled)} rows, got {table.shape[0]}"
            )
    requests: list[RequestPlan] = []
    logits_indices: list[int] = []
    offset = 0  # the request's first fed token, step-wide
    for i, item in enumerate(scheduled):
        seq, start, n = item.seq, item.start, item.num_new_tokens
        if item.slot_mapping.shape != (n,):
            raise ValueError(
                f"request {seq.request_id!r}: slot_mapping expected shape ({n},), "
                f"got {item.slot_mapping.shape}"
            )
        if item.draft_token_ids:
            v = verify_rows(item)
            token_ids, positions, slots = v.input_ids, v.positions, v.slot_mapping
        else:
            token_ids = np.asarray(seq.token_ids[start : start + n], dtype=np.int64)
            positions = np.arange(start, start + n, dtype=np.int64)
            slots = item.slot_mapping.astype(np.int64, copy=False)
        prompt = prompt_positions(item)
        row = len(logits_indices)
        logits_indices.extend(offset + (p - start) for p in prompt)
        sample: int | None = None
        if item.samples:
            sample = len(logits_indices)
            logits_indices.append(offset + n - 1)
            logits_indices.extend(offset + n + j for j in range(len(item.draft_token_ids)))
        k = len(item.draft_token_ids) if sample is not None else 0
        drafts = range(0) if sample is None else range(sample + 1, sample + 1 + k)
        requests.append(
            RequestPlan(
                request_id=seq.request_id,
                start=start,
                num_new_tokens=n,
                token_ids=token_ids,
                positions=positions,
                kv=tuple(
                    GroupKV(
                        slots if g == 0 else group_slots(t[i], positions, page_size or 1),
                        np.asarray(t[i], dtype=np.int32),
                    )
                    for g, t in enumerate(page_tables)
                ),
                draft_token_ids=item.draft_token_ids,
                rows=LogitsRows(range(row, row + len(prompt)), sample, drafts),
                prompt_first=prompt.start + 1,
                prompt_targets=tuple(seq.token_ids[p + 1] for p in prompt),
                num_prompt_logprobs=seq.params.prompt_logprobs or 0,
                sampling=sampling_state(seq) if item.samples else None,
            )
        )
        offset += int(token_ids.shape[0])
    return StepPlan(tuple(requests), np.asarray(logits_indices, dtype=np.int64))
