"""Worker of ``test_warm_up.py``: which kernel signatures first requests add after the warm-up.

``python -m tests.engine.warm_up_worker OUT.json [--server] [OPTION=VALUE ...]`` builds the
embedded model's engine with those engine options (e.g. ``kv_cache_dtype=float16``), runs
:func:`pagedattn.engine.warm_up.warm_up`, records every Numba dispatcher's signatures, then runs
a first request of each kind a user sends (a chat-length prompt, a chunked long prompt and its
prefix-cache hit, a copy task that drafts and verifies, many sequences at once, sampling with
logprobs and ``n`` > 1, a JSON schema) and writes, per kind, the signatures that kind added:
``{"kinds": {kind: {kernel: [signature, ...]}}, "warm_up_drafted": int, "drafted": int,
"steps_after_warm_up": int, "finished_after_warm_up": {reason: count}, "warm_up_s": float}``
(drafted: draft tokens the warm-up's and the first requests' verify
steps checked). With ``--server`` it builds the server's app instead (``build_app``, which
warms the engine up) and sends chat requests (plain, streamed, with a JSON schema) through it.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from typing import Any

from numba.core.registry import CPUDispatcher

import pagedattn.engine.warm_up as warm_up_module
from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.engine.guided import GrammarCompiler, GuidedSpec
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams


def signatures() -> dict[str, set[str]]:
    """Every live Numba dispatcher's compiled (or cache-loaded) signatures, by qualified name."""
    out: dict[str, set[str]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, CPUDispatcher):
            name = f"{obj.py_func.__module__}.{obj.py_func.__qualname__}"
            out.setdefault(name, set()).update(str(s) for s in obj.signatures)
    return out


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def added_by(kinds: dict[str, Callable[[], None]]) -> dict[str, dict[str, list[str]]]:
    """Per kind, the signatures its request added to those already there (run in order)."""
    added: dict[str, dict[str, list[str]]] = {}
    for kind, request in kinds.items():
        before = signatures()
        request()
        after = signatures()
        new = {k: sorted(v - before.get(k, set())) for k, v in after.items()}
        added[kind] = {k: v for k, v in new.items() if v}
    return added


def server(kwargs: dict[str, object]) -> dict[str, object]:
    """``build_app`` (what ``pagedattn serve`` runs), then a chat request and a JSON-schema one
    through the HTTP routes."""
    from fastapi.testclient import TestClient

    from pagedattn.server.app import build_app

    app = build_app(None, **kwargs)  # type: ignore[arg-type]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    chat = {"model": "SmolLM2-135M-Instruct", "max_tokens": 6, "temperature": 0}
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with TestClient(app) as client:

        def post(body: dict[str, object]) -> None:
            reply = client.post("/v1/chat/completions", json={**chat, **body})
            assert reply.status_code == 200, reply.text

        format_ = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
        kinds: dict[str, Callable[[], None]] = {
            "server chat": lambda: post({"messages": messages}),
            "server stream": lambda: post({"messages": messages, "stream": True}),
            "server json schema": lambda: post({"messages": messages, "response_format": format_}),
        }
        return {"kinds": added_by(kinds)}


def main(out_path: str, options: list[str]) -> None:
    kwargs = {k: _value(v) for k, v in (o.split("=", 1) for o in options if o != "--server")}
    if "--server" in options:
        with open(out_path, "w") as f:
            json.dump(server(kwargs), f, indent=1)
        return
    llm = LLM(**kwargs)
    engine = llm.engine
    tok = engine.tokenizer
    counted: dict[str, int] = {}
    reset = warm_up_module._reset_counters

    def read_then_reset(stats: Any) -> None:  # what the warm-up ran, before its reset
        counted["drafted"] = stats.spec_num_drafted_tokens
        reset(stats)

    warm_up_module._reset_counters = read_then_reset
    warm_up_s = warm_up_module.warm_up(engine)
    after_warm_up = engine.get_stats()
    warm_up_drafted = counted["drafted"]
    chat = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    long = corpus_token_ids(tok, None, 700)[:700]  # > the default chunk of 512: two chunks
    passage = corpus_token_ids(tok, None, 120)[:120]
    copy = [*passage, *tok.encode(" Repeat the passage word for word: "), *passage[:20]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    compiler = GrammarCompiler(tok, engine.model_config.vocab_size)
    guided = SamplingParams(
        temperature=0.0,
        max_tokens=8,
        logits_processors=(compiler.processor(GuidedSpec("json", schema)),),
    )
    sampled = SamplingParams(
        temperature=0.8,
        top_p=0.9,
        top_k=40,
        max_tokens=5,
        n=2,
        seed=1,
        logprobs=3,
        prompt_logprobs=2,
        repetition_penalty=1.1,
    )

    def run(prompts: list[list[int]], params: SamplingParams) -> None:
        llm.generate(prompts, params, use_tqdm=False)

    kinds: dict[str, Callable[[], None]] = {
        "chat": lambda: run([chat], greedy),
        "single token prompt": lambda: run([chat[:1]], greedy),
        "chunked long prompt": lambda: run([long], greedy),
        "prefix-cache hit": lambda: run([long[:600]], greedy),
        "speculative copy": lambda: run(
            [copy], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        ),
        "many sequences": lambda: run([[*chat[:-1], 200 + i, chat[-1]] for i in range(20)], greedy),
        "sampling, logprobs, n": lambda: run([chat], sampled),
        "json schema": lambda: run([chat], guided),
    }
    added = added_by(kinds)
    drafted = int(engine.get_stats()["spec_num_drafted_tokens"])
    result = {
        "kinds": added,
        "steps_after_warm_up": after_warm_up["num_steps"],
        "finished_after_warm_up": after_warm_up["num_finished"],
        "warm_up_drafted": warm_up_drafted,
        "drafted": drafted,
        "warm_up_s": warm_up_s,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
