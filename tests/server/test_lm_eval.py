"""lm-evaluation-harness as a real client of `pagedattn serve`, on the project's own cloze
task (benchmarks/lm_eval: task YAMLs + cloze.jsonl cut from a public-domain novel; nothing
downloaded).

- ``local-chat-completions`` runs the ``generate_until`` task: every response lm-eval logged
  equals the answer the openai client gets for the same messages, and lm-eval's exact_match
  equals the score computed here from those responses.
- ``local-completions`` runs the multiple-choice task by loglikelihood (echo + logprobs, which
  the engine side provides): per-item loglikelihoods equal lm-eval's own ``hf`` model on the
  same weights within 1e-3 and the accuracy is identical, one prompt per request and several
  (lm-eval's ``batch_size``). Skipped while the server refuses ``echo``.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, ServerFactory

lm_eval = pytest.importorskip("lm_eval")
# the task data is a local JSONL; nothing may be fetched from a hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_eval"
LIMIT = 8


@pytest.fixture(scope="module")
def server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """This module's own tiny-model server: the session server's prefix cache, which other
    modules' cached-token counts depend on, stays untouched."""
    with make_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped task YAMLs with the data path made absolute (lm-eval resolves it against
    the working directory)."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    for name in ("cloze.yaml", "cloze_gen.yaml"):
        text = (TASKS / name).read_text(encoding="utf-8")
        text = text.replace("benchmarks/lm_eval/cloze.jsonl", str(TASKS / "cloze.jsonl"))
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def evaluate(task_dir: Path, task: str, model: str, model_args: str, **kwargs: Any) -> Any:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[task],
        task_manager=TaskManager(include_path=str(task_dir)),
        limit=LIMIT,
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
        **kwargs,
    )


def test_cloze_data_is_what_make_cloze_writes() -> None:
    rows = [json.loads(line) for line in (TASKS / "cloze.jsonl").read_text().splitlines()]
    assert len(rows) == 40
    for row in rows:
        assert len(row["choices"]) == 4 and 0 <= row["answer"] < 4
        assert len(set(row["choices"])) == 4


def normalise(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return re.sub(r"\s+", " ", text).strip()


def test_generate_until_through_local_chat_completions(
    server: RunningServer, client: Any, task_dir: Path
) -> None:
    url = f"{server.url}/v1/chat/completions"
    out = evaluate(
        task_dir,
        "pagedattn_cloze_gen",
        "local-chat-completions",
        f"model=tiny-llama,base_url={url},tokenizer_backend=none,max_retries=1",
        apply_chat_template=True,
    )
    samples = out["samples"]["pagedattn_cloze_gen"]
    assert len(samples) == LIMIT
    hits = 0
    for sample in samples:
        chat, gen_kwargs = sample["arguments"][0]  # (JsonChatStr(prompt), gen_kwargs)
        assert gen_kwargs["until"] == ["\n", "."] and gen_kwargs["max_gen_toks"] == 8
        messages = json.loads(chat[0])
        answer = client.chat.completions.create(
            model="tiny-llama", messages=messages, max_tokens=8, temperature=0,
            stop=["\n", "."], seed=1234,
        )  # fmt: skip
        text = answer.choices[0].message.content
        assert sample["resps"][0][0] == text
        hits += normalise(text) == normalise(sample["target"])
    assert out["results"]["pagedattn_cloze_gen"]["exact_match,none"] == pytest.approx(hits / LIMIT)


def server_has_echo(srv: RunningServer) -> bool:
    body = {"prompt": [1, 2, 3], "max_tokens": 1, "echo": True, "logprobs": 1}
    return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).status_code == 200


@pytest.fixture(scope="module")
def hf_results(tiny_model_dir: Path, task_dir: Path) -> Any:
    """lm-eval's own ``hf`` model on the task: the oracle, computed once for every batch size."""
    return evaluate(
        task_dir,
        "pagedattn_cloze",
        "hf",
        f"pretrained={tiny_model_dir},dtype=float32,device=cpu",
        batch_size=1,
    )


@pytest.mark.hf
@pytest.mark.parametrize("batch_size", [1, 4])
def test_loglikelihood_through_local_completions_equals_hf(
    server: RunningServer, task_dir: Path, hf_results: Any, batch_size: int
) -> None:
    if not server_has_echo(server):
        pytest.skip("the server refuses echo + logprobs (engine side not merged)")
    url = f"{server.url}/v1/completions"
    ours = evaluate(
        task_dir,
        "pagedattn_cloze",
        "local-completions",
        f"model=tiny-llama,base_url={url},tokenizer_backend=remote,max_retries=1,"
        f"batch_size={batch_size}",  # batch_size > 1: several prompts per request
    )
    hf = hf_results
    ours_s = sorted(ours["samples"]["pagedattn_cloze"], key=lambda s: s["doc_id"])
    hf_s = sorted(hf["samples"]["pagedattn_cloze"], key=lambda s: s["doc_id"])
    assert len(ours_s) == len(hf_s) == LIMIT
    for a, b in zip(ours_s, hf_s, strict=True):
        ll_a = [float(r[0][0]) for r in a["resps"]]
        ll_b = [float(r[0][0]) for r in b["resps"]]
        assert ll_a == pytest.approx(ll_b, abs=1e-3), a["doc_id"]
    assert (
        ours["results"]["pagedattn_cloze"]["acc,none"]
        == hf["results"]["pagedattn_cloze"]["acc,none"]
    )
