"""Hand-allocated pages for driving LlamaModel.forward in tests (the engine comes later)."""

from __future__ import annotations

import numpy as np

from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel


class PagedSequences:
    """A KV pool plus one page table per sequence; pages are handed out in a shuffled order so
    that a sequence's pages are not contiguous in the pool."""

    def __init__(self, model: LlamaModel, num_pages: int, page_size: int, seed: int = 0) -> None:
        self.model = model
        self.page_size = page_size
        self.kv = np.zeros(model.kv_shape(num_pages, page_size), np.float32)
        self.free = list(np.random.default_rng(seed).permutation(num_pages))
        self.tables: list[list[int]] = []
        self.lens: list[int] = []

    def new_sequence(self) -> int:
        self.tables.append([])
        self.lens.append(0)
        return len(self.tables) - 1

    def _slots(self, seq: int, count: int) -> list[int]:
        slots = []
        for pos in range(self.lens[seq], self.lens[seq] + count):
            if pos // self.page_size == len(self.tables[seq]):
                self.tables[seq].append(int(self.free.pop()))
            slots.append(
                self.tables[seq][pos // self.page_size] * self.page_size + pos % self.page_size
            )
        return slots

    def step(self, chunks: dict[int, list[int]]) -> np.ndarray:
        """Feed new tokens of several sequences in one batch; logits of each one's last token."""
        ids, positions, slots, starts = [], [], [], [0]
        for seq, tokens in chunks.items():
            ids += tokens
            positions += range(self.lens[seq], self.lens[seq] + len(tokens))
            slots += self._slots(seq, len(tokens))
            self.lens[seq] += len(tokens)
            starts.append(starts[-1] + len(tokens))
        seqs = list(chunks)
        width = max(len(self.tables[s]) for s in seqs)
        tables = np.full((len(seqs), width), -1, np.int32)
        for row, s in enumerate(seqs):
            tables[row, : len(self.tables[s])] = self.tables[s]
        batch = ForwardBatch(
            input_ids=np.array(ids, np.int64),
            positions=np.array(positions, np.int64),
            slot_mapping=np.array(slots, np.int64),
            query_start_loc=np.array(starts, np.int32),
            context_lens=np.array([self.lens[s] for s in seqs], np.int32),
            page_tables=tables,
            logits_indices=np.array(starts[1:], np.int64) - 1,
        )
        return self.model.forward(batch, self.kv)

    def all_logits(self, seq: int, tokens: list[int]) -> np.ndarray:
        """Prefill ``tokens`` and return the logits of every row (for teacher-forcing checks)."""
        start = self.lens[seq]
        slots = self._slots(seq, len(tokens))
        self.lens[seq] += len(tokens)
        batch = ForwardBatch(
            input_ids=np.array(tokens, np.int64),
            positions=np.arange(start, start + len(tokens), dtype=np.int64),
            slot_mapping=np.array(slots, np.int64),
            query_start_loc=np.array([0, len(tokens)], np.int32),
            context_lens=np.array([self.lens[seq]], np.int32),
            page_tables=np.array([self.tables[seq]], np.int32),
            logits_indices=np.arange(len(tokens), dtype=np.int64),
        )
        return self.model.forward(batch, self.kv)


def greedy(
    model: LlamaModel, prompt: list[int], max_new_tokens: int, page_size: int = 16
) -> list[int]:
    """Greedy decoding: one prefill, then one decode step per new token."""
    pages = (len(prompt) + max_new_tokens) // page_size + 2
    state = PagedSequences(model, pages, page_size)
    seq = state.new_sequence()
    logits = state.step({seq: prompt})
    out = [int(np.argmax(logits[0]))]
    while len(out) < max_new_tokens:
        logits = state.step({seq: [out[-1]]})
        out.append(int(np.argmax(logits[0])))
    return out
