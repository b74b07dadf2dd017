"""Scheduling that tells the truth: a long prompt never stalls running streams (its prefill is
capped per step and chunked on a grid fixed by its own length), and a preempted request
resumes before newer ones."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from tests.engine.helpers import assert_all_pages_free, make_engine, solo, tiny_model

from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.sampling_params import SamplingParams

MODEL = tiny_model(seed=4, max_position_embeddings=8192)
RNG = np.random.default_rng(5)
STREAM = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
ONE = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


class BatchLog:
    """Wraps the model; records each forward's (first position, new tokens) per sequence row."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.rows: list[list[tuple[int, int]]] = []

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray:
        starts = batch.query_start_loc.tolist()
        self.rows.append([(int(batch.positions[a]), b - a) for a, b in itertools.pairwise(starts)])
        return np.asarray(self.model.forward(batch, kv))


def test_a_6000_token_prompt_never_stalls_8_decoding_streams() -> None:
    log = BatchLog(MODEL)
    engine = make_engine(log, page_size=16, num_pages=600, max_num_batched_tokens=2048)
    chunk = engine.config.scheduler.prefill_chunk_size
    assert chunk == 256  # an eighth of the token budget
    streams = {f"s{i}": RNG.integers(3, 272, 5 + i).tolist() for i in range(8)}
    long_prompt = RNG.integers(3, 272, 6000).tolist()
    for rid, prompt in streams.items():
        engine.add_request(prompt, STREAM, request_id=rid)
    outs: dict[str, list[int]] = {rid: [] for rid in [*streams, "long"]}
    steps_with_long = 0
    for step in range(200):
        if step == 2:  # the streams are decoding
            engine.add_request(long_prompt, ONE, request_id="long")
        running = {s.request_id for s in engine.scheduler.running}
        got: dict[str, int] = {}
        for out in engine.step():
            got[out.request_id] = len(out.outputs[0].token_ids)
            outs[out.request_id] += out.outputs[0].token_ids
        for rid in running & set(streams):
            assert got.get(rid) == 1, (step, rid)  # every running stream: a token every step
        if step >= 2 and len(outs["s0"]) < STREAM.max_tokens:
            steps_with_long += 1
        if not engine.has_unfinished_requests():
            break
    # the long prompt was computed in chunks of 256 tokens at its start, shorter as its context
    # grows (a token at position s counts 1 + s / 3072: its attention), one per step
    long_rows = [r for rows in log.rows for r in rows if r[1] > 1 and sum(r) > 20]
    assert [start for start, _ in long_rows] == _grid(6000, chunk, 3072)
    assert long_rows[0] == (0, 256) and 80 < long_rows[-2][1] < 95  # 256 / (1 + 5846 / 3072)
    assert all(n * (1 + s / 3072) <= chunk + 4 for s, n in long_rows)
    assert steps_with_long >= len(long_rows)  # it ran beside the streams, not after them
    for rid, prompt in streams.items():
        assert outs[rid] == solo(MODEL, prompt, STREAM), rid
    assert outs["long"] == solo(MODEL, long_prompt, ONE, page_size=16, num_pages=600)
    assert_all_pages_free(engine)


def test_long_prompts_beside_decodes_take_one_chunk_of_work_per_step() -> None:
    # two long prompts and a short one arrive together while 4 streams decode: each step gives
    # every stream its token and at most one chunk's worth of prompt work (a token at position
    # s costs 1 + s / 1024), so the prompts take turns in arrival order instead of piling up
    log = BatchLog(MODEL)
    engine = make_engine(log, page_size=16, num_pages=700, max_num_batched_tokens=2048,
                         long_prefill_token_threshold=256,
                         prefill_attention_tokens=1024)  # fmt: skip
    streams = {f"s{i}": RNG.integers(3, 272, 4 + i).tolist() for i in range(4)}
    prompts = {"a": RNG.integers(3, 272, 2000).tolist(), "b": RNG.integers(3, 272, 1500).tolist(),
               "c": RNG.integers(3, 272, 40).tolist()}  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for rid, prompt in streams.items():
        engine.add_request(prompt, params, request_id=rid)
    outs: dict[str, list[int]] = {rid: [] for rid in [*streams, *prompts]}
    first_token: dict[str, int] = {}
    shared = 0  # steps where prompt work ran beside the streams
    for step in range(400):
        if step == 2:
            for rid, prompt in prompts.items():
                engine.add_request(prompt, ONE, request_id=rid)
        decoding = {s.request_id for s in engine.scheduler.running if s.num_generated_tokens > 0}
        got = {out.request_id: out.outputs[0].token_ids for out in engine.step()}
        for rid, ids in got.items():
            outs[rid] += ids
            if ids and rid in prompts:
                first_token.setdefault(rid, step)
        streams_ran = decoding & set(streams)
        for rid in streams_ran:
            assert len(got.get(rid, [])) == 1, (step, rid)  # a token every step
        pieces = [(s, n) for s, n in log.rows[-1] if n > 1]
        if streams_ran and pieces:
            shared += 1
            work = sum(n * (1 + s / 1024) for s, n in pieces)
            assert len(pieces) == 1 or work <= 256, (step, pieces)
        if not engine.has_unfinished_requests():
            break
    assert shared >= 12  # the prompts were computed beside the streams, not after them
    assert first_token["a"] < first_token["b"] <= first_token["c"]  # in arrival order
    for rid, prompt in streams.items():
        assert outs[rid] == solo(MODEL, prompt, params), rid
    for rid, prompt in prompts.items():
        assert outs[rid] == solo(MODEL, prompt, ONE, page_size=16, num_pages=700), rid
    assert_all_pages_free(engine)


def test_without_decodes_a_step_prefills_several_prompts() -> None:
    # nothing decodes: the step takes prompt pieces up to the token budget, not one chunk
    log = BatchLog(MODEL)
    engine = make_engine(log, page_size=16, num_pages=200, max_num_batched_tokens=1024,
                         long_prefill_token_threshold=256)  # fmt: skip
    prompts = [RNG.integers(3, 272, 200).tolist() for _ in range(4)]
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, ONE, request_id=f"p{i}")
    engine.step()
    assert log.rows[0] == [(0, 200)] * 4
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_pages_free(engine)


def _grid(num_tokens: int, size: int, attention_tokens: int) -> list[int]:
    """Chunk starts by hand: the chunk at s holds size / (1 + s / attention_tokens) tokens,
    rounded."""
    starts, s = [], 0
    while s < num_tokens:
        starts.append(s)
        s += max(1, math.floor(size / (1 + s / attention_tokens) + 0.5))
    return starts


def test_chunk_boundaries_depend_only_on_the_prompt_and_the_chunk_size() -> None:
    prompt = RNG.integers(3, 272, 50).tolist()

    def boundaries(others: int) -> list[tuple[int, int]]:
        log = BatchLog(MODEL)
        engine = make_engine(
            log,
            page_size=4,
            num_pages=128,
            max_num_batched_tokens=16,
            long_prefill_token_threshold=12,
        )
        for i in range(others):
            engine.add_request(RNG.integers(3, 272, 3 + i).tolist(), STREAM, request_id=f"o{i}")
        engine.add_request(prompt, ONE, request_id="p")
        while engine.has_unfinished_requests():
            engine.step()
        return [r for rows in log.rows for r in rows if r[1] > 1 and r[0] + r[1] > 9]

    alone = boundaries(0)
    assert [s for s, _ in alone] == [0, 12, 24, 36, 48]
    assert boundaries(3) == alone  # whatever else shares the steps


def test_a_preempted_request_resumes_before_newer_ones() -> None:
    prompts = [RNG.integers(3, 272, 6).tolist() for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    # 10 pages of 4: "a" and "b" need 7 pages each at their largest, so "b" is preempted
    engine = make_engine(MODEL, page_size=4, num_pages=10)
    engine.add_request(prompts[0], params, request_id="a")
    engine.add_request(prompts[1], params, request_id="b")
    order: list[str] = []  # first step each request is running again after waiting
    preempted_seen = False
    outs: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    for _ in range(200):
        waiting = [s.request_id for s in engine.scheduler.waiting]
        if "b" in waiting and not preempted_seen:
            preempted_seen = True
            engine.add_request(prompts[2], params, request_id="c")  # newer than "b"
        for out in engine.step():
            outs[out.request_id] += out.outputs[0].token_ids
        running = [s.request_id for s in engine.scheduler.running]
        assert running == sorted(running)  # arrival order: the oldest is preempted last
        if preempted_seen:
            order += [r for r in running if r in ("b", "c") and r not in order]
        if not engine.has_unfinished_requests():
            break
    assert preempted_seen and engine.get_stats()["num_preemptions"] >= 1
    assert order[0] == "b"  # the older, preempted request runs again before the newer one
    for rid, prompt in zip("abc", prompts, strict=True):
        assert outs[rid] == solo(MODEL, prompt, params), rid
    assert_all_pages_free(engine)
