"""One option vocabulary across commands: help shows plain placeholders, config errors name
the flag the user typed, `serve` takes `--sliding-window 0` (= off) and `--position-mode` like
`generate`, and `demo` refuses a window its pool cannot hold instead of shrinking it."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagedattn.cli import _register
from pagedattn.cli import engine_options as options
from pagedattn.cli.app import app
from pagedattn.cli.errors import flag_message

COMMANDS = [
    ["generate"], ["chat"], ["serve"], ["demo"],
    ["bench", "kernels"], ["bench", "generate"], ["bench", "engine"],
]  # fmt: skip


def invoke(*args: str) -> tuple[int, str, str]:
    _register()
    result = CliRunner(env={"COLUMNS": "160"}).invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_has_no_type_placeholders(command: list[str]) -> None:
    code, out, _ = invoke(*command, "--help")
    assert code == 0
    assert "--help" in out
    for placeholder in ("<bool>", "<str>", "<int>", "<float>", "<path>"):
        assert placeholder not in out, (command, placeholder)


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["serve"]], ids=" ".join)
def test_engine_options_are_one_vocabulary(command: list[str]) -> None:
    _, out, _ = invoke(*command[:1], "--help")
    for flag in ("--model", "--page-size", "--kv-cache-mib", "--sliding-window", "--sinks",
                 "--position-mode", "--prefix-caching"):  # fmt: skip
        assert flag in out, (command, flag)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sinks", "4"], "error: --sinks: needs --sliding-window > 0"),
        (["--page-size", "0"], "error: --page-size: expected an int >= 1, got 0"),
        (
            ["--position-mode", "shifted"],
            "error: --position-mode 'shifted': needs --sliding-window > 0",
        ),
        (["--position-mode", "sideways"], "error: --position-mode: expected one of"),
        (["--sliding-window", "-3"], "error: --sliding-window: expected an int >= 0 (0 = off)"),
    ],
)
def test_serve_config_errors_name_the_flag(args: list[str], message: str) -> None:
    code, _, err = invoke("serve", "--sliding-window", "0", *args)
    assert code == 2 and err.startswith(message), err


def test_serve_accepts_window_zero_and_position_mode(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    code, _, err = invoke(
        "serve", "-m", str(tiny_gguf), "--sliding-window", "0", "--position-mode", "absolute",
        "--served-model-name", "a", "--served-model-name", "b", "--port", "0",
    )  # fmt: skip
    assert code == 0, err
    engine = seen["app"].state.async_engine.engine  # type: ignore[attr-defined]
    assert engine.config.cache.sliding_window is None
    assert engine.config.cache.position_mode == "absolute"
    code, _, err = invoke(
        "serve", "-m", str(tiny_gguf), "--sliding-window", "32", "--sinks", "4",
        "--position-mode", "shifted",
    )  # fmt: skip
    assert code == 0, err
    cache = seen["app"].state.async_engine.engine.config.cache  # type: ignore[attr-defined]
    assert (cache.sliding_window, cache.num_sink_tokens, cache.position_mode) == (32, 4, "shifted")


def test_demo_refuses_a_window_the_pool_cannot_hold() -> None:
    # W = 64 at page_size 16 needs ceil(64 / 16) + 1 = 5 pages
    code, _, err = invoke("demo", "--tokens", "8", "--num-pages", "4", "--sliding-window", "64")
    assert code == 2
    assert "needs 5 pages of 16 tokens; --num-pages is 4" in err
    code, out, _ = invoke(
        "demo", "--tokens", "8", "--num-pages", "5", "--sliding-window", "64",
        "--num-heads", "2", "--num-kv-heads", "1", "--head-dim", "8",
    )  # fmt: skip
    assert code == 0, out


def test_flag_message_maps_config_fields() -> None:
    assert flag_message("SchedulerConfig.max_num_seqs: expected an int >= 1, got 0") == (
        "--max-num-seqs: expected an int >= 1, got 0"
    )
    assert flag_message("top_k: expected an int >= -1") == "--top-k: expected an int >= -1"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("cached", [False, True])
def test_build_engine_says_on_a_terminal_when_the_kernels_will_compile(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    monkeypatch.setattr(options, "kernels_cached", lambda: cached)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    args = dict(page_size=4, kv_cache_mib=1.0, sliding_window=0, sinks=0)
    options.build_engine(str(tiny_gguf), **args, position_mode="absolute")
    assert (options.COMPILE_NOTICE in terminal.getvalue()) == (not cached)
    pipe = io.StringIO()  # not a terminal (a log, CliRunner): never said
    monkeypatch.setattr(sys, "stderr", pipe)
    options.build_engine(str(tiny_gguf), **args, position_mode="absolute")
    assert pipe.getvalue() == ""


def test_kernels_cached_reads_numba_s_index_of_the_decode_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pagedattn.model.decode_layer import decode_layer

    cache_file = decode_layer._cache._cache_file
    assert isinstance(cache_file._load_index(), dict)  # the private API it relies on
    monkeypatch.setattr(cache_file, "_load_index", lambda: {})  # missing, or stamped otherwise
    assert options.kernels_cached() is False
    monkeypatch.setattr(cache_file, "_load_index", lambda: {"signature": "entry"})
    assert options.kernels_cached() is True

    def broken() -> dict[str, str]:
        raise AttributeError("a Numba without this API")

    monkeypatch.setattr(cache_file, "_load_index", broken)
    assert options.kernels_cached() is True  # unknown: say nothing


@pytest.mark.parametrize(
    "cluster", [["--replicas", "2"], ["--ray-address", "auto"]], ids=["replicas", "ray-address"]
)
def test_serve_refuses_a_header_timeout_on_ray_serve(cluster: list[str]) -> None:
    # Ray Serve's HTTP proxy reads the headers there: the option would be silently ignored
    code, _, err = invoke("serve", *cluster, "--header-timeout", "5")
    assert code == 2
    assert err.startswith("error: --header-timeout is served by one process only")
    assert "Ray Serve's HTTP proxy" in err
