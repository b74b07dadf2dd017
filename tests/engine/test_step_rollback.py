"""Every phase of a step commits or rolls back: a schedule that raises leaves every sequence
and page as before it (the next steps run as if nothing happened), and a failure in one
request's postprocess (a child request's commit) ends that request alone. Oracles: engines that
never saw a fault."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tests.engine.helpers import GREEDY, assert_all_pages_free, drain, make_engine, solo, tokens
from tests.engine.helpers import tiny_model as _tiny

from pagedattn.sampling_params import SamplingParams

MODEL = _tiny(seed=13)
RNG = np.random.default_rng(17)
PROMPTS = [RNG.integers(3, MODEL.config.vocab_size, n).tolist() for n in (10, 13, 7)]
OPTIONS: dict[str, Any] = {"page_size": 4, "num_pages": 64}


def fresh(prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return solo(MODEL, prompt, params, **OPTIONS)


@pytest.mark.parametrize("fail_at", [2, 3])
def test_a_schedule_that_raises_gives_back_every_reservation(
    fail_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # step 2 decodes "a" and "b" and admits "c": the fault hits the 2nd or the 3rd reservation
    engine = make_engine(MODEL, **OPTIONS)
    manager = engine.cache_manager
    real_append, calls = manager.append_slots, []

    def append_slots(seq_id: Any, token_ids: Any) -> np.ndarray:
        calls.append(seq_id)
        if len(calls) == 2 + fail_at:  # 2 reservations in step 1, then step 2's
            raise RuntimeError("injected: the reservation failed")
        return real_append(seq_id, token_ids)

    monkeypatch.setattr(manager, "append_slots", append_slots)
    engine.add_request(PROMPTS[0], GREEDY, request_id="a")
    engine.add_request(PROMPTS[1], GREEDY, request_id="b")
    outs: dict[str, list[Any]] = {"a": [], "b": []}
    for out in engine.step():
        outs[out.request_id].append(out)
    engine.add_request(PROMPTS[2], GREEDY, request_id="c")
    before = {s.seq_id: manager.num_tokens(s.seq_id) for s in engine.scheduler.running}
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    manager.check_integrity()  # between steps: nothing reserved is left behind
    assert {s.seq_id: manager.num_tokens(s.seq_id) for s in engine.scheduler.running} == before
    assert [s.request_id for s in engine.scheduler.waiting] == ["c"]
    for rid, more in drain(engine).items():
        outs.setdefault(rid, []).extend(more)
    for rid, prompt in zip("abc", PROMPTS, strict=True):
        assert outs[rid][-1].error is None, rid
        assert tokens(outs[rid]) == fresh(prompt), rid
    assert_all_pages_free(engine)


def test_a_child_commit_that_raises_fails_only_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(MODEL, **OPTIONS)
    manager = engine.cache_manager
    real_commit = manager.commit_written

    def commit_written(seq_id: Any, num_tokens: int) -> None:
        child = engine.scheduler.get("1_f")
        if child is not None and child.seq_id == seq_id:
            raise MemoryError("injected: the commit failed")
        real_commit(seq_id, num_tokens)

    monkeypatch.setattr(manager, "commit_written", commit_written)
    params = SamplingParams(n=3, temperature=0.9, seed=5, max_tokens=6, ignore_eos=True)
    arrivals = {0: [("f", PROMPTS[1], params), ("a", PROMPTS[0], GREEDY)]}
    arrivals[1] = [("b", PROMPTS[2], GREEDY)]
    outs = drain(engine, arrivals)
    final = outs["f"][-1]
    assert final.finished and "MemoryError" in (final.error or "")
    last = {c.index: c.finish_reason for o in outs["f"] for c in o.outputs}
    assert last == {0: "error", 1: "error", 2: "error"}
    assert tokens(outs["a"]) == fresh(PROMPTS[0]) and outs["a"][-1].error is None
    assert tokens(outs["b"]) == fresh(PROMPTS[2]) and outs["b"][-1].error is None
    # counted per child request: f's three children, then a and b
    assert engine.get_stats()["num_finished"] == {"error": 3, "length": 2}
    assert_all_pages_free(engine)
