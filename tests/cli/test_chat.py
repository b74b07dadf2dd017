"""`pagedattn chat` driven as a user would (stdin lines through typer's CliRunner): answers
stream, each turn reuses the KV pages of the conversation so far, /reset and /exit work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.chat  # noqa: F401  (registers the command)
from pagedattn.cli.app import app
from pagedattn.cli.chat import PROMPT_MARKER, Conversation
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

runner = CliRunner()
STATS = re.compile(r"cached prompt tokens: (\d+) of (\d+)")


def _chat(lines: list[str], *args: str) -> tuple[list[str], list[tuple[int, int]], str]:
    """Answers (one per turn), (cached, prompt) token counts per turn, stderr."""
    result = runner.invoke(app, ["chat", *args], input="".join(f"{x}\n" for x in lines))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(PROMPT_MARKER)
    turns = result.stdout.split(PROMPT_MARKER)[1:]
    answers = [t.removesuffix("\n") for t in turns if t.strip()]
    counts = [(int(a), int(b)) for a, b in STATS.findall(result.stderr)]
    return answers, counts, result.stderr


def _fresh_answer(model: str, ids: list[int], params: SamplingParams) -> tuple[str, list[int]]:
    """The greedy answer of a new engine (empty prefix cache) on exactly these prompt ids."""
    out = LLM(model, page_size=4).generate([ids], params, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    return out.outputs[0].text, out.outputs[0].token_ids


def test_second_turn_reuses_history_pages_and_equals_a_fresh_run(tiny_gguf: Path) -> None:
    n, model = 10, str(tiny_gguf)
    args = ["-m", model, "--page-size", "4", "--max-tokens", str(n), "--ignore-eos", "--stats"]
    answers, counts, _ = _chat(["the cat sat", "and then?"], *args)
    assert len(answers) == 2 and len(counts) == 2

    # Rebuild the conversation's exact ids the way the command should have.
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    conv = Conversation(LLM(model).engine.tokenizer)
    ids1, text1 = conv.prompt_for("the cat sat")
    answer1, gen1 = _fresh_answer(model, ids1, params)
    conv.record("the cat sat", ids1, text1, gen1, answer1)
    ids2, _ = conv.prompt_for("and then?")
    assert ids2[: len(ids1) + n] == ids1 + gen1  # the history ids are kept, not re-tokenized
    answer2, _ = _fresh_answer(model, ids2, params)

    assert answers == [answer1, answer2]
    assert counts[0] == (0, len(ids1))
    # Every full page of the history whose KV was computed (all tokens but the last answer
    # token) is reused: (prompt + answer - 1) rounded down to whole pages.
    reused = (len(ids1) + n - 1) // 4 * 4
    assert counts[1] == (reused, len(ids2))
    assert reused >= (len(ids1) + n) // 4 * 4 - 4


def test_reset_starts_a_new_conversation_and_exit_ends(tiny_gguf: Path) -> None:
    args = ["-m", str(tiny_gguf), "--page-size", "4", "--max-tokens", "6", "--stats"]
    answers, counts, err = _chat(
        ["hello there", "/reset", "hello there", "/exit", "ignored"], *args
    )
    assert "(conversation cleared)" in err
    assert len(answers) == 2 and answers[0] == answers[1]
    prompt_len = counts[0][1]
    # Same prompt again: its full pages come from the cache of the first conversation.
    assert counts == [(0, prompt_len), ((prompt_len - 1) // 4 * 4, prompt_len)]


def test_end_of_input_ends_the_chat_and_system_message_is_used(tiny_gguf: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=5)
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    expected = LLM(str(tiny_gguf)).chat(conv, params, use_tqdm=False)[0].outputs[0].text
    answers, _, _ = _chat(["hi"], "-m", str(tiny_gguf), "--max-tokens", "5", "--system", "be brief")
    assert answers == [expected]


def test_bad_option_is_one_line_error(tiny_gguf: Path) -> None:
    result = runner.invoke(app, ["chat", "-m", str(tiny_gguf), "--top-p", "2"], input="hi\n")
    assert result.exit_code == 1
    assert result.stderr == "error: --top-p: expected a float in (0, 1], got 2.0\n"


@pytest.mark.model
def test_real_model_two_turns_reuse_the_conversation() -> None:
    n = 12
    answers, counts, _ = _chat(
        ["My name is Ada. Say hello to me.", "What is my name?"],
        "--max-tokens", str(n), "--ignore-eos", "--stats",
    )  # fmt: skip
    assert len(answers) == 2 and all(answers)
    (cached1, len1), (cached2, len2) = counts
    assert cached1 == 0
    assert len2 > len1 + n
    assert cached2 >= (len1 + n) // 16 * 16 - 16
    # Turn 2's answer equals a greedy run on the same conversation ids without any cache.
    llm = LLM(enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    conv = Conversation(llm.engine.tokenizer)
    ids1, text1 = conv.prompt_for("My name is Ada. Say hello to me.")
    first_out = llm.generate([ids1], params, use_tqdm=False)[0]
    first = first_out.outputs[0]
    conv.record("My name is Ada. Say hello to me.", ids1, text1, first.token_ids, first.text)
    ids2, _ = conv.prompt_for("What is my name?")
    fresh_out = llm.generate([ids2], params, use_tqdm=False)[0]
    fresh = fresh_out.outputs[0]
    assert fresh_out.num_cached_tokens == 0 and len(ids2) == len2
    assert [first.text, fresh.text] == answers


CHILD = """
import signal, sys, time
from pagedattn.model.llama import LlamaModel

# Ctrl-C as in a terminal: a job started in the background (as CI may run the suite) inherits an
# ignored SIGINT, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)

import pagedattn.cli.stream as stream

real_forward = LlamaModel.forward
real_warm_up = stream.warm_up
state = {"slow": True, "warm": False}


def warm_up(*args, **kwargs):
    result = real_warm_up(*args, **kwargs)
    state["warm"] = True
    return result


def forward(self, batch, kv):
    # the first turn's prefill stalls before writing any KV: the user presses Ctrl-C meanwhile
    if state["slow"] and state["warm"] and batch.num_tokens > 1:
        state["slow"] = False
        sys.stderr.write("FORWARD-STARTED\\n")
        sys.stderr.flush()
        # short sleeps, as a real forward runs bytecode between its kernels: a SIGINT that lands
        # on a worker thread (Numba's) is seen by the main thread at the next one
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return real_forward(self, batch, kv)


LlamaModel.forward = forward
stream.warm_up = warm_up
from pagedattn.cli import main

sys.argv = ["pagedattn", "chat", *sys.argv[1:]]
main()
"""


def test_ctrl_c_mid_forward_never_poisons_the_next_turn(tiny_gguf: Path) -> None:
    """A real SIGINT to a `pagedattn chat` process while a turn's forward runs: the turn is
    dropped and the same message again is answered exactly as by a fresh engine, with no
    prompt token served from pages the interrupted forward never wrote."""
    import os
    import signal
    import subprocess
    import sys

    n, model, line = 6, str(tiny_gguf), "the cat sat on the mat and the dog sat on the log"
    args = ["-m", model, "--page-size", "4", "--max-tokens", str(n), "--ignore-eos", "--stats"]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stderr is not None
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        seen = []
        while not seen or seen[-1] != "FORWARD-STARTED":
            got = proc.stderr.readline()
            assert got, "".join(seen)
            seen.append(got.strip())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(f"{line}\n/exit\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted; the turn was dropped" in err
    answers = [t.removesuffix("\n") for t in out.split(PROMPT_MARKER)[1:] if t.strip()]
    counts = [(int(a), int(b)) for a, b in STATS.findall(err)]
    conv = Conversation(LLM(model).engine.tokenizer)
    ids, _ = conv.prompt_for(line)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    fresh, _ = _fresh_answer(model, ids, params)
    assert answers[-1] == fresh
    assert counts == [(0, len(ids))]  # the interrupted forward wrote nothing to reuse
