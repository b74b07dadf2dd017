"""vLLM's request fields, walked one by one on a real server (the tiny model, the `openai`
client or plain HTTP): each has its row in deploy/README.md's field table and is honoured, or
accepted with the value that changes nothing (the same output as without it) and refused with
a 400 naming it otherwise. The field lists below are vLLM 0.20.2's, read from its protocol
models (``vllm/entrypoints/openai/completion/protocol.py`` ``CompletionRequest``,
``chat_completion/protocol.py`` ``ChatCompletionRequest``, ``engine/protocol.py``
``StreamOptions``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer as HFTokenizer

from pagedattn.server import protocol as p
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory, serve_app
from tests.server.tiny_folder import write_tiny_folder

VLLM_VERSION = "0.20.2"
VLLM_COMPLETION_FIELDS = [
    "model",
    "prompt",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
    "use_beam_search",
    "top_k",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "allowed_token_ids",
    "prompt_logprobs",
    "prompt_embeds",
    "add_special_tokens",
    "response_format",
    "structured_outputs",
    "priority",
    "request_id",
    "return_tokens_as_token_ids",
    "return_token_ids",
    "cache_salt",
    "kv_transfer_params",
    "vllm_xargs",
    "repetition_detection",
]
VLLM_CHAT_FIELDS = [
    "messages",
    "model",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "presence_penalty",
    "response_format",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "thinking_token_budget",
    "include_reasoning",
    "parallel_tool_calls",
    "user",
    "use_beam_search",
    "top_k",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "prompt_logprobs",
    "allowed_token_ids",
    "bad_words",
    "echo",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "media_io_kwargs",
    "mm_processor_kwargs",
    "structured_outputs",
    "priority",
    "request_id",
    "return_tokens_as_token_ids",
    "return_token_ids",
    "cache_salt",
    "kv_transfer_params",
    "vllm_xargs",
    "repetition_detection",
]
VLLM_STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")
# fields of later vLLM releases honoured too
LATER_FIELDS = ("truncation_side",)

PROMPT = "once upon a time there"
MESSAGES = [{"role": "user", "content": "the cat sat"}]
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def _table() -> str:
    readme = (Path(__file__).resolve().parents[2] / "deploy" / "README.md").read_text()
    return readme[readme.index("### Request fields") : readme.index("### Responses API")]


def test_every_vllm_field_has_a_row_and_is_declared() -> None:
    rows = [line for line in _table().splitlines() if line.startswith("| `") or "| vLLM" in line]
    firsts = [row.split("|")[1] for row in rows]
    for fields, model in (
        (VLLM_COMPLETION_FIELDS, p.CompletionRequest),
        (VLLM_CHAT_FIELDS, p.ChatCompletionRequest),
    ):
        for name in (*fields, *LATER_FIELDS):
            assert any(f"`{name}`" in first for first in firsts), (
                f"{name}: no row (vLLM {VLLM_VERSION})"
            )
            assert name in model.model_fields, f"{name}: not declared on {model.__name__}"
    for name in VLLM_STREAM_OPTIONS:
        assert f"`{name}`" in _table() and name in p.StreamOptions.model_fields


@pytest.fixture(scope="module")
def srv(make_server: ServerFactory) -> Iterator[RunningServer]:
    with make_server() as s:
        yield s


@pytest.fixture(scope="module")
def wide(make_server: ServerFactory) -> Iterator[RunningServer]:
    """A server that allows logprobs over the whole vocabulary (``--max-logprobs -1``)."""
    with make_server(max_logprobs=-1) as s:
        yield s


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFTokenizer:
    """The model's tokenizer read by HF `tokenizers` from its tokenizer.json."""
    return HFTokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def _post(srv: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    base = {"prompt": PROMPT} if path == COMPLETIONS else {"messages": MESSAGES}
    req = {**base, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **body}
    return httpx.post(f"{srv.url}{path}", json=req, timeout=60)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return str(choice["text"] if "text" in choice else choice["message"]["content"])


# field -> (routes, the value that changes nothing, a value that would change something; None:
# every value changes nothing)
NO_EFFECT: dict[str, tuple[tuple[str, ...], Any, Any]] = {
    "use_beam_search": ((COMPLETIONS, CHAT), False, True),
    "length_penalty": ((COMPLETIONS, CHAT), 0.5, None),
    "priority": ((COMPLETIONS, CHAT), 0, 1),
    "prompt_embeds": ((COMPLETIONS,), None, "AAAA"),
    "cache_salt": ((COMPLETIONS, CHAT), None, "salt"),
    "kv_transfer_params": ((COMPLETIONS, CHAT), None, {"do_remote_decode": True}),
    "vllm_xargs": ((COMPLETIONS, CHAT), {}, {"k": 1}),
    "repetition_detection": ((COMPLETIONS, CHAT), None, {"max_pattern_size": 4}),
    "reasoning_effort": ((CHAT,), None, "low"),
    "thinking_token_budget": ((CHAT,), -1, 10),
    "include_reasoning": ((CHAT,), False, None),
    "media_io_kwargs": ((CHAT,), {}, {"video": {"num_frames": 4}}),
    "mm_processor_kwargs": ((CHAT,), {}, {"size": 4}),
}
CASES = [(f, r) for f, (routes, _, _) in NO_EFFECT.items() for r in routes]


@pytest.mark.parametrize(("field", "path"), CASES, ids=[f"{f}-{r[4:]}" for f, r in CASES])
def test_vllm_field_accepted_when_it_changes_nothing(
    srv: RunningServer, field: str, path: str
) -> None:
    _, same, other = NO_EFFECT[field]
    plain = _text(_post(srv, path, {}))
    assert _text(_post(srv, path, {field: same})) == plain
    if other is None:
        return
    r = _post(srv, path, {field: other})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_spaces_between_special_tokens(srv: RunningServer) -> None:
    plain = _text(_post(srv, COMPLETIONS, {}))
    assert _text(_post(srv, COMPLETIONS, {"spaces_between_special_tokens": False})) == plain
    r = _post(
        srv, COMPLETIONS, {"spaces_between_special_tokens": False, "skip_special_tokens": False}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "spaces_between_special_tokens"


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_field_nobody_defines_stays_a_400(srv: RunningServer, path: str) -> None:
    r = _post(srv, path, {"use_beam_serch": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_serch"


def test_truncate_prompt_tokens_and_side(srv: RunningServer) -> None:
    ids = list(range(10, 18))

    def prompt_ids(**extra: Any) -> Any:
        r = _post(srv, COMPLETIONS, {"prompt": ids, "return_token_ids": True, **extra})
        return r.json()["choices"][0]["prompt_token_ids"] if r.status_code == 200 else r

    assert prompt_ids(truncate_prompt_tokens=4, truncation_side="right") == ids[:4]
    assert prompt_ids(truncate_prompt_tokens=4, truncation_side="left") == ids[-4:]
    assert prompt_ids(truncate_prompt_tokens=4) == ids[-4:]  # vLLM's default for generation
    assert prompt_ids(truncate_prompt_tokens=-1) == ids  # fits the context: nothing cut
    assert prompt_ids(truncate_prompt_tokens=20) == ids
    for keep in (0, -2):
        refused = prompt_ids(truncate_prompt_tokens=keep)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "truncate_prompt_tokens"
    too_big = prompt_ids(truncate_prompt_tokens=510)  # 512-token context less max_tokens 6
    assert too_big.status_code == 400
    assert too_big.json()["error"]["param"] == "truncate_prompt_tokens"
    whole = _post(srv, CHAT, {"return_token_ids": True}).json()["prompt_token_ids"]
    cut = _post(srv, CHAT, {"return_token_ids": True, "truncate_prompt_tokens": 5}).json()
    assert cut["prompt_token_ids"] == whole[-5:] and cut["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_whole_vocabulary_logprobs_need_max_logprobs(srv: RunningServer, path: str) -> None:
    body = (
        {"prompt_logprobs": -1} if path == COMPLETIONS else {"logprobs": True, "top_logprobs": -1}
    )
    r = _post(srv, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == next(iter(body.keys() - {"logprobs"}))
    r = _post(srv, COMPLETIONS, {"logprobs": -1})  # completions logprobs: never -1 (vLLM)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_prompt_logprobs_minus_one_is_the_whole_distribution(
    wide: RunningServer, hf: HFTokenizer
) -> None:
    vocab = hf.get_vocab_size()
    r = _post(wide, COMPLETIONS, {"prompt_logprobs": -1, "max_tokens": 1})
    assert r.status_code == 200, r.text
    positions = r.json()["choices"][0]["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(hf.encode(PROMPT).ids)
    for pos in positions[1:]:
        assert len(pos) == vocab
        assert math.fsum(math.exp(e["logprob"]) for e in pos.values()) == pytest.approx(1, 1e-6)


def test_chat_top_logprobs_minus_one_streamed_and_not(wide: RunningServer, hf: HFTokenizer) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{wide.url}/v1", api_key="x", max_retries=0)
    kwargs: dict[str, Any] = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 3}
    kwargs.update(temperature=0, logprobs=True, top_logprobs=-1)
    out = client.chat.completions.create(**kwargs)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for token in content:
        assert len(token.top_logprobs) == hf.get_vocab_size()
        total = math.fsum(math.exp(t.logprob) for t in token.top_logprobs)
        assert total == pytest.approx(1, 1e-6)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_allowed_token_ids_bound_every_sampled_token(srv: RunningServer) -> None:
    allowed = [40, 41, 42, 77]
    for path in (COMPLETIONS, CHAT):
        r = _post(
            srv,
            path,
            {
                "allowed_token_ids": allowed,
                "temperature": 1.0,
                "seed": 3,
                "max_tokens": 12,
                "return_token_ids": True,
            },
        )
        assert r.status_code == 200, r.text
        ids = r.json()["choices"][0]["token_ids"]
        assert len(ids) == 12 and set(ids) <= set(allowed)
    r = _post(srv, COMPLETIONS, {"allowed_token_ids": [100000]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids"


def test_bad_words_are_never_generated(srv: RunningServer, hf: HFTokenizer) -> None:
    body = {"temperature": 1.0, "seed": 9, "max_tokens": 24, "return_token_ids": True}
    plain = _post(srv, COMPLETIONS, body).json()["choices"][0]
    # the two most frequent generated tokens that are printable words of one token
    counts: dict[int, int] = {}
    for t in plain["token_ids"]:
        word = hf.decode([t]).lstrip()
        if word.isprintable() and len(hf.encode(word, add_special_tokens=False).ids) == 1:
            counts[t] = counts.get(t, 0) + 1
    words = [hf.decode([t]) for t in sorted(counts, key=lambda t: -counts[t])[:2]]
    assert words, plain["token_ids"]
    out = _post(srv, COMPLETIONS, {**body, "bad_words": words}).json()["choices"][0]
    spellings = set()  # one-token spellings are banned everywhere
    for w in words:
        for spelled in (w.lstrip(), " " + w.lstrip()):
            ids = hf.encode(spelled, add_special_tokens=False).ids
            spellings |= set(ids) if len(ids) == 1 else set()
    assert spellings & set(plain["token_ids"])  # what was generated before is banned now
    assert len(out["token_ids"]) == 24 and not spellings & set(out["token_ids"])
    r = _post(srv, CHAT, {"bad_words": [""]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words"


def test_request_id_names_the_response(srv: RunningServer) -> None:
    assert _post(srv, COMPLETIONS, {"request_id": "abc"}).json()["id"] == "cmpl-abc"
    assert _post(srv, CHAT, {"request_id": "abc"}).json()["id"] == "chatcmpl-abc"


def test_documents_and_custom_roles_reach_the_template(srv: RunningServer, hf: HFTokenizer) -> None:
    template = (
        "{% for d in documents %}[{{ d.title }}]{% endfor %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    messages = [{"role": "critic", "content": "no"}]
    r = _post(
        srv,
        CHAT,
        {
            "messages": messages,
            "chat_template": template,
            "documents": [{"title": "t1", "text": "x"}],
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == hf.encode("[t1]<critic>no", add_special_tokens=False).ids


def test_return_tokens_as_token_ids(srv: RunningServer) -> None:
    r = _post(
        srv,
        COMPLETIONS,
        {"logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    choice = r.json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    for token, top in zip(
        choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"], strict=True
    ):
        assert token in top and all(k.startswith("token_id:") for k in top)


def test_continuous_usage_over_several_prompts_and_choices(srv: RunningServer) -> None:
    body = {"prompt": [PROMPT, "the dog"], "n": 2, "temperature": 1.0, "seed": 5, "stream": True}
    body |= {
        "max_tokens": 4,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    body |= {"return_token_ids": True, "ignore_eos": True}
    counts: dict[int, int] = {}
    with httpx.stream("POST", f"{srv.url}{COMPLETIONS}", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    import json

    chunks = [json.loads(e) for e in events]
    for chunk in chunks[:-1]:
        choice = chunk["choices"][0]
        counts[choice["index"]] = counts.get(choice["index"], 0) + len(choice["token_ids"])
        assert chunk["usage"]["completion_tokens"] == counts[choice["index"]]
    assert counts == {0: 4, 1: 4, 2: 4, 3: 4}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    # vLLM's rule: continuous_usage_stats without include_usage adds nothing
    body["stream_options"] = {"include_usage": False, "continuous_usage_stats": True}
    for path, extra in ((COMPLETIONS, {}), (CHAT, {"messages": MESSAGES})):
        req = {**body, **extra}
        if path == CHAT:
            del req["prompt"]
        with httpx.stream("POST", f"{srv.url}{path}", json=req, timeout=60) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert events and all(e.get("usage") is None for e in events)


def test_load_stays_zero_without_tracking_and_ping_is_health(srv: RunningServer) -> None:
    assert httpx.get(f"{srv.url}/load", timeout=10).json() == {"server_load": 0}
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{srv.url}/ping", timeout=10)
        assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.fixture(scope="module")
def bos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a tokenizer whose post-processor puts <|endoftext|> first."""
    from tokenizers.processors import TemplateProcessing

    folder = write_tiny_folder(tmp_path_factory.mktemp("bos") / "tiny-bos")
    tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    bos = "<|endoftext|>"
    tok.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_add_special_tokens(bos_folder: Path) -> None:
    from pagedattn.server.app import build_app

    hf = HFTokenizer.from_file(str(bos_folder / "tokenizer.json"))
    with serve_app(build_app(str(bos_folder), **TINY_OPTIONS)) as srv:

        def prompt_ids(path: str, **extra: Any) -> list[int]:
            r = _post(srv, path, {"return_token_ids": True, "max_tokens": 1, **extra})
            body = r.json()
            return list(
                body["choices"][0]["prompt_token_ids"]
                if path == COMPLETIONS
                else body["prompt_token_ids"]
            )

        with_bos = hf.encode(PROMPT).ids
        assert with_bos[0] == hf.token_to_id("<|endoftext|>")
        assert prompt_ids(COMPLETIONS) == with_bos  # completions: true by default
        assert prompt_ids(COMPLETIONS, add_special_tokens=False) == with_bos[1:]
        chat = prompt_ids(CHAT)  # chat: false by default (the template writes its own)
        assert chat[0] != with_bos[0]
        assert prompt_ids(CHAT, add_special_tokens=True) == [with_bos[0], *chat]
