"""Batch invariance on the real SmolLM2 Q4_1 weights: a sequence's logits are bitwise the same
computed alone or inside any batch (decode-only or mixed with prefill chunks), and generated
tokens (greedy and seeded sampling) do not depend on what else runs or when it arrived."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from pagedattn.engine.llm import LLM, merge_delta
from pagedattn.engine.outputs import RequestOutput
from pagedattn.kernels import paged
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

pytestmark = pytest.mark.model
PAGE = 16


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.from_loaded(load_model(None))


class Pool:
    """A KV pool with one page table per sequence; ``rows`` runs any mix of sequences' next
    tokens at fixed positions (re-running a step rewrites the same slots with the same K/V)."""

    def __init__(self, model: LlamaModel, lens: list[int], rng: np.random.Generator) -> None:
        self.model = model
        pages = [-(-(n + 64) // PAGE) for n in lens]
        order = rng.permutation(sum(pages)).astype(np.int32)  # scattered pages
        self.kv = np.zeros(model.kv_shape(sum(pages), PAGE), np.float32)
        starts = np.cumsum([0, *pages])
        self.tables = [order[a:b] for a, b in itertools.pairwise(starts)]
        self.tokens = [rng.integers(0, model.config.vocab_size, n + 64).tolist() for n in lens]

    def rows(self, chunks: list[tuple[int, int, int]]) -> list[np.ndarray]:
        """Run chunks (seq, start, length) in one forward; logits of every row of each chunk."""
        ids, pos, slots, qsl = [], [], [], [0]
        for s, start, n in chunks:
            ids += self.tokens[s][start : start + n]
            pos += range(start, start + n)
            slots += [int(self.tables[s][p // PAGE]) * PAGE + p % PAGE for p in pos[-n:]]
            qsl.append(qsl[-1] + n)
        width = max(len(self.tables[s]) for s, _, _ in chunks)
        tables = np.full((len(chunks), width), -1, np.int32)
        for row, (s, _, _) in enumerate(chunks):
            tables[row, : len(self.tables[s])] = self.tables[s]
        batch = ForwardBatch(
            input_ids=np.array(ids, np.int64),
            positions=np.array(pos, np.int64),
            slot_mapping=np.array(slots, np.int64),
            query_start_loc=np.array(qsl, np.int32),
            context_lens=np.array([start + n for _, start, n in chunks], np.int32),
            page_tables=tables,
            logits_indices=np.arange(qsl[-1], dtype=np.int64),
        )
        logits = self.model.forward(batch, self.kv)
        return [logits[a:b] for a, b in itertools.pairwise(qsl)]


def test_logits_rows_are_bitwise_batch_invariant(
    model: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short contexts get several flash-decoding splits too (each by its own length).
    monkeypatch.setattr(paged, "SPLIT_MIN_KEYS", 16)
    rng = np.random.default_rng(0)
    lens = [int(n) for n in rng.integers(3, 90, 34)]
    pool = Pool(model, lens, rng)
    pool.rows([(s, 0, n) for s, n in enumerate(lens[:32])])  # prompts of 32 sequences in KV
    alone = [pool.rows([(s, lens[s], 1)])[0] for s in range(32)]  # next token of each, alone
    assert len({len(x) for x in alone}) == 1
    for size in (2, 3, 5, 8, 13, 32):  # decode-only batches, the sequences in shuffled order
        seqs = rng.permutation(32)[:size]
        got = pool.rows([(int(s), lens[s], 1) for s in seqs])
        for s, row in zip(seqs, got, strict=True):
            np.testing.assert_array_equal(row, alone[s], err_msg=f"seq {s} in batch of {size}")
    # Prefill chunks of two more sequences: alone, then mixed with decode rows.
    chunk_a, chunk_b = (32, 0, lens[32]), (33, 0, 7)
    solo_a, solo_b = pool.rows([chunk_a])[0], pool.rows([chunk_b])[0]
    for size in (1, 4, 16, 30):
        seqs = [int(s) for s in rng.permutation(32)[:size]]
        mix = [(s, lens[s], 1) for s in seqs[: size // 2]] + [chunk_a]
        mix += [(s, lens[s], 1) for s in seqs[size // 2 :]] + [chunk_b]
        got = pool.rows(mix)
        np.testing.assert_array_equal(got[len(seqs[: size // 2])], solo_a)
        np.testing.assert_array_equal(got[-1], solo_b)
        for (s, _, _), row in zip(mix, got, strict=True):
            if s < 32:
                np.testing.assert_array_equal(row[0], alone[s][0], err_msg=f"seq {s}, mixed")


PROMPTS = [
    "The capital of France is",
    "Water boils at",
    "My favourite colour is",
    "Once upon a time",
    "The best way to learn",
    "In 1969, astronauts",
    "A haiku about rain:",
    "def fibonacci(n):",
    "The opposite of hot is",
    "Bonjour, je",
    "Three primary colours are",
    "The speed of light",
    "Cats are",
    "import numpy as",
    "Dear Sir or Madam,",
    "The tallest mountain",
]
#: Enough for every seeded request to leave its greedy twin and for the staggered arrivals
#: (one per step) to overlap 24 deep; the logits test above covers batches up to 32 bitwise.
NEW_TOKENS = 24


def requests() -> Iterator[tuple[str, SamplingParams]]:
    """16 greedy and 16 seeded sampling requests (seeds differ; the same 16 short prompts,
    each under a page, so the prefix cache never changes a prompt's chunking)."""
    for i, prompt in enumerate(PROMPTS):
        yield prompt, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        seeded = SamplingParams(
            temperature=0.9, top_p=0.95, seed=1000 + i, max_tokens=NEW_TOKENS, ignore_eos=True
        )
        yield prompt, seeded


def test_generated_tokens_do_not_depend_on_the_batch() -> None:
    llm = LLM(page_size=PAGE, num_pages=32 * 6 + 8, max_num_seqs=32)
    reqs = list(requests())
    assert all(len(llm.engine.tokenizer.encode(p)) < PAGE for p, _ in reqs)
    alone = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p, params in reqs]
    assert all(len(ids) == NEW_TOKENS for ids in alone)
    assert alone[1] != alone[0]  # the seeded request really samples
    together = llm.generate([p for p, _ in reqs], [q for _, q in reqs], use_tqdm=False)
    assert [r.outputs[0].token_ids for r in together] == alone
    # Staggered: request i arrives after i engine steps, while the earlier ones decode.
    engine, ids = llm.engine, []
    results_map: dict[str, RequestOutput] = {}
    pending = list(reqs)
    while pending or engine.has_unfinished_requests():
        if pending:
            prompt, params = pending.pop(0)
            ids.append(engine.add_request(prompt, params))
        for out in engine.step():
            merge_delta(results_map, out)
    results = [results_map[rid].outputs[0].token_ids for rid in ids]
    assert results == alone
