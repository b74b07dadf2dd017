"""--kv-store on generate and chat, chat --session across restarts, LLM(kv_store=...), as a user
runs them (typer's CliRunner; each invocation is a fresh engine with an empty pool)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.chat
import pagedattn.cli.generate  # noqa: F401  (registers the commands)
from pagedattn.cli.app import app
from pagedattn.cli.chat import PROMPT_MARKER
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

runner = CliRunner()
TIER = re.compile(r"prompt tokens from the kv store: (\d+)")
CACHED = re.compile(r"cached prompt tokens: (\d+) of (\d+)")


def _chat(lines: list[str], *args: str) -> tuple[list[str], str]:
    result = runner.invoke(app, ["chat", *args], input="".join(f"{x}\n" for x in lines))
    assert result.exit_code == 0, result.stderr
    turns = result.stdout.split(PROMPT_MARKER)[1:]
    return [t.removesuffix("\n") for t in turns if t.strip()], result.stderr


@pytest.mark.parametrize("evicted", [False, True])
def test_chat_session_resumes_after_restart(tiny_gguf: Path, tmp_path: Path, evicted: bool) -> None:
    common = ["-m", str(tiny_gguf), "--page-size", "4", "--max-tokens", "8", "--ignore-eos"]
    # the oracle: one process, both turns, no store
    whole, _ = _chat(["the cat sat", "and then?"], *common)
    store = ["--kv-store", str(tmp_path), "--session", "s1", "--stats"]
    first, err1 = _chat(["the cat sat"], *common, *store)
    assert "new session 's1'" in err1 and first == whole[:1]
    if evicted:  # the tier lost every page: the conversation comes back, its KV is recomputed
        for page in (tmp_path / "kv").rglob("*.page"):
            page.unlink()
    second, err2 = _chat(["and then?"], *common, *store)  # a restart: empty pool
    assert "resumed session 's1': 1 turns" in err2
    assert second == whole[1:]  # the same answer as without the restart
    (cached, _), tier = CACHED.findall(err2)[0], int(TIER.findall(err2)[0])
    assert int(cached) == tier  # every reused page came from the tier
    assert tier == 0 if evicted else tier > 0
    assert (tmp_path / "documents" / "session-s1.json").is_file()


def test_session_uses_the_user_cache_dir_by_default(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda name: str(tmp_path / name))
    args = ["-m", str(tiny_gguf), "--max-tokens", "4", "--session", "default-dir"]
    _chat(["hello"], *args)
    assert (
        tmp_path / "pagedattn" / "kv-store" / "documents" / "session-default-dir.json"
    ).is_file()


def test_bad_session_document_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "session-bad.json").write_bytes(b"\x80\x04\x95pickle")
    args = ["chat", "-m", str(tiny_gguf), "--kv-store", str(tmp_path), "--session", "bad"]
    result = runner.invoke(app, args, input="hi\n")
    assert result.exit_code == 1 and "session: not a JSON document" in result.stderr
    result = runner.invoke(app, [*args[:-1], "../x"], input="hi\n")
    assert result.exit_code == 1 and "--session" in result.stderr


def test_generate_with_kv_store_restores_on_the_second_run(tiny_gguf: Path, tmp_path: Path) -> None:
    args = ["generate", "tell me about cats and dogs", "-m", str(tiny_gguf), "--page-size", "4"]
    args += ["--max-tokens", "6", "--ignore-eos", "--stats", "--kv-store", str(tmp_path)]
    first = runner.invoke(app, args)
    second = runner.invoke(app, args)
    assert first.exit_code == 0 and second.exit_code == 0, second.stderr
    assert TIER.findall(first.stderr) == ["0"]
    restored = int(TIER.findall(second.stderr)[0])
    assert restored > 0 and second.stdout == first.stdout


def test_llm_kv_store(tiny_gguf: Path, tmp_path: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = "a long enough prompt to fill a few pages of four tokens"
    scratch = LLM(str(tiny_gguf), page_size=4).generate(prompt, params, use_tqdm=False)[0]
    llm = LLM(str(tiny_gguf), page_size=4, kv_store=str(tmp_path))
    llm.generate(prompt, params, use_tqdm=False)
    llm.engine.close()
    again = LLM(str(tiny_gguf), page_size=4, kv_store=str(tmp_path))
    out = again.generate(prompt, params, use_tqdm=False)[0]
    assert out.num_cached_tokens == (len(out.prompt_token_ids) - 1) // 4 * 4 > 0
    assert out.outputs[0].token_ids == scratch.outputs[0].token_ids
