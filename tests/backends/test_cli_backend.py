"""`--backend` / `--device` on generate, chat and serve as a user types them, and
``LLM(backend=...)``: torch answers as numpy does; an invalid or missing pair is one line on
stderr and exit code 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.chat
import pagedattn.cli.generate
import pagedattn.cli.serve  # noqa: F401  (register the commands)
from pagedattn.backends import BackendError
from pagedattn.cli.app import app
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

runner = CliRunner()
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_generate_on_torch_cpu_prints_what_numpy_prints(tiny_gguf: Path) -> None:
    args = ["generate", "the cat", "--model", str(tiny_gguf), "--max-tokens", "12"]
    numpy_run = runner.invoke(app, args)
    torch_run = runner.invoke(app, [*args, "--backend", "torch", "--device", "cpu"])
    assert numpy_run.exit_code == 0, numpy_run.stderr
    assert torch_run.exit_code == 0, torch_run.stderr
    assert torch_run.stdout == numpy_run.stdout and len(numpy_run.stdout) > 1


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_llm_on_torch_equals_llm_on_numpy(tiny_gguf: Path) -> None:
    params = SamplingParams(temperature=0.7, seed=4, max_tokens=16, n=2)
    want = LLM(str(tiny_gguf)).generate("the rain in", params, use_tqdm=False)[0]
    got = LLM(str(tiny_gguf), backend="torch").generate("the rain in", params, use_tqdm=False)[0]
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]
    assert [c.text for c in got.outputs] == [c.text for c in want.outputs]


INVALID = [
    (["--backend", "numpy", "--device", "cuda"], "backend 'numpy' does not run on device 'cuda'"),
    (["--backend", "cupy", "--device", "cpu"], "backend 'cupy' does not run on device 'cpu'"),
    (["--backend", "cupy"], "backend 'cupy' serves KVStream and the kernels"),
    (["--backend", "jax"], "backend 'jax' is unknown"),
    (["--backend", "torch", "--device", "tpu"], "device 'tpu' is unknown"),
]


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
@pytest.mark.parametrize(("flags", "message"), INVALID, ids=lambda x: " ".join(x)[:30])
def test_invalid_pairs_are_one_line_and_exit_2(
    tiny_gguf: Path, command: str, flags: list[str], message: str
) -> None:
    args = [command, *(["hello"] if command == "generate" else []), "-m", str(tiny_gguf)]
    result = runner.invoke(app, [*args, *flags], input="hi\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_int8_kv_pages_on_torch_are_refused_by_name(tiny_gguf: Path) -> None:
    args = ["generate", "hi", "-m", str(tiny_gguf), "--backend", "torch"]
    result = runner.invoke(app, [*args, "--kv-cache-dtype", "int8"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (
        "error: --kv-cache-dtype 'int8': the numpy backend only (got backend 'torch')\n"
    )


@pytest.mark.skipif(not HAS_TORCH or _cuda(), reason="needs torch without a CUDA device")
def test_torch_cuda_without_a_gpu_says_so(tiny_gguf: Path) -> None:
    result = runner.invoke(
        app, ["generate", "hi", "-m", str(tiny_gguf), "--backend", "torch", "--device", "cuda"]
    )
    assert result.exit_code == 2
    assert "found no CUDA device" in result.stderr and result.stderr.count("\n") == 1


def test_llm_refuses_cupy_with_one_line() -> None:
    with pytest.raises(
        BackendError, match="run the model with --backend torch --device cuda"
    ) as info:
        LLM(backend="cupy")
    assert "\n" not in str(info.value)
