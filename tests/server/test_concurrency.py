"""One engine loop serves many streaming clients at once; clients that leave mid-stream abort
their requests and every page returns to the pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

NUM_CLIENTS = 32
CANCELLED = {3, 7, 11, 15, 19, 23, 27, 31}  # these leave after two chunks
CANCELLED_MAX_TOKENS = 8000  # far more than can run before a hang-up reaches the engine
NUM_PAGES = 4096
WORDS = ["the", "cat", "sat", "on", "mat", "in", "rain", "at", "noon", "when", "her", "star"]


def prompt(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(2 + i % 5))


async def one_client(server: RunningServer, i: int) -> str | None:
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", timeout=120, max_retries=0
    )
    async with client:
        stream = await client.completions.create(
            model="tiny-llama",
            prompt=prompt(i),
            max_tokens=CANCELLED_MAX_TOKENS if i in CANCELLED else 10 + i % 7,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        parts: list[str] = []
        async for chunk in stream:
            parts.extend(c.text for c in chunk.choices)
            if i in CANCELLED and len(parts) == 2:
                await stream.close()  # hang up mid-stream
                return None
        return "".join(parts)


async def all_clients(server: RunningServer) -> list[str | None]:
    return list(await asyncio.gather(*(one_client(server, i) for i in range(NUM_CLIENTS))))


def test_concurrent_streams_equal_solo_runs_and_cancels_free_pages(
    make_server: ServerFactory, long_model_dir: Path
) -> None:
    with make_server(model_dir=long_model_dir, num_pages=NUM_PAGES) as server:
        _check_concurrent_streams(server, long_model_dir)


def _check_concurrent_streams(server: RunningServer, model_dir: Path) -> None:
    before = server.metrics()
    results = asyncio.run(all_clients(server))
    after = server.wait_idle()

    llm = LLM(str(model_dir), **TINY_OPTIONS)
    for i, text in enumerate(results):
        if i in CANCELLED:
            assert text is None
            continue
        params = SamplingParams(temperature=0, max_tokens=10 + i % 7, ignore_eos=True)
        assert text == llm.generate(prompt(i), params, use_tqdm=False)[0].outputs[0].text, i

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta('pagedattn:request_success_total{finished_reason="abort"}') == len(CANCELLED)
    assert delta('pagedattn:request_success_total{finished_reason="length"}') == (
        NUM_CLIENTS - len(CANCELLED)
    )
    assert after["pagedattn:num_used_pages"] == 0
    assert after["pagedattn:kv_cache_usage_perc"] == 0
    assert after["pagedattn:num_free_pages"] == after["pagedattn:num_pages"] == NUM_PAGES
    # the engine thread is idle (blocked on its queue): the cache invariants hold
    engine = server.app.state.async_engine.engine
    engine.cache_manager.check_integrity()
    assert not engine.has_unfinished_requests()
    # the cancelled requests stopped early: far fewer than their tokens were generated
    generated = delta("pagedattn:generation_tokens_total")
    completed = sum(10 + i % 7 for i in range(NUM_CLIENTS) if i not in CANCELLED)
    assert generated < completed + len(CANCELLED) * CANCELLED_MAX_TOKENS // 4
