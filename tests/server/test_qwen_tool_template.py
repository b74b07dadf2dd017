"""Tool calls through Qwen2.5's own chat template (Hermes ``<tool_call>`` JSON): the server finds
the format by rendering the file's template, the prompt with tools equals HF transformers'
``apply_chat_template`` on the same GGUF, the tool-call grammar accepts the tokens of a call as
Qwen writes it, and the reply parses into the call. The file is pulled by name when missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedattn.engine.guided import GrammarCompiler, GuidedSpec
from pagedattn.model.catalogue import CATALOGUE, installed_path
from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf
from pagedattn.model.pull import pull
from pagedattn.model.tokenizer import Tokenizer
from pagedattn.server.structured import StructuredOutput
from pagedattn.server.tool_format import FormatCache, ToolFormat, auto_grammar, parse_calls

pytestmark = [pytest.mark.model, pytest.mark.hf]

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    }
]
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}],
    },
    {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
]


@pytest.fixture(scope="module")
def qwen() -> tuple[Tokenizer, Any]:
    transformers = pytest.importorskip("transformers")
    model = CATALOGUE["qwen2.5-coder-0.5b"]
    path: Path = installed_path(model) or pull(model)
    ours = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, hf


def test_the_template_writes_hermes_tool_calls(qwen: tuple[Tokenizer, Any]) -> None:
    ours, _ = qwen
    assert FormatCache().format_of(ours, None) == ToolFormat("<tool_call>", "</tool_call>")


@pytest.mark.parametrize("turns", [1, 3])
def test_prompt_with_tools_equals_hf(qwen: tuple[Tokenizer, Any], turns: int) -> None:
    ours, hf = qwen
    messages = CONVERSATION[:turns]
    expected = hf.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ours.apply_chat_template(messages, tools=TOOLS) == expected
    assert "<tools>" in expected and "get_weather" in expected
    assert ours.encode(expected, add_special_tokens=False) == hf.encode(
        expected, add_special_tokens=False
    )


def test_grammar_accepts_a_qwen_call_and_the_reply_parses(qwen: tuple[Tokenizer, Any]) -> None:
    ours, _ = qwen
    fmt = FormatCache().format_of(ours, None)
    assert fmt is not None
    special = StructuredOutput(ours, ours.vocab_size).special_tokens((fmt.open_tag, fmt.close_tag))
    grammar = auto_grammar([("get_weather", WEATHER)], fmt, False, special)
    processor = GrammarCompiler(ours).processor(GuidedSpec("grammar", grammar, "tools"))
    reply = f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"
    ids = ours.encode(reply, add_special_tokens=False)
    for i in range(len(ids)):
        assert processor.allowed(ids[:i])[ids[i]], (i, ours.id_to_token(ids[i]))
    end = processor.allowed(ids)
    assert end[ours.backend.token_to_id("<|im_end|>")]  # the call may end the turn
    wrong = ours.encode('<tool_call>\n{"name": "get_time"', add_special_tokens=False)
    assert not all(processor.allowed(wrong[:i])[wrong[i]] for i in range(len(wrong)))
    assert parse_calls(ours.decode(ids), fmt) == (None, [("get_weather", CALL["arguments"])])
