"""`pagedattn generate PROMPT`: stream one answer to stdout."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pagedattn.cli.app import app
from pagedattn.cli.engine_options import SERVER_OPTIONS, EngineOptions
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.option_groups import option_group
from pagedattn.cli.sampling_options import SamplingOptions, StatsOption, SystemOption


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command("generate")
@option_group(SamplingOptions, max_tokens=128)
@option_group(EngineOptions, omit=SERVER_OPTIONS)
def generate(
    prompt: Annotated[
        str, typer.Argument(metavar="PROMPT", help="The user message (or plain text with --raw).")
    ],
    raw: Annotated[
        bool, typer.Option("--raw", metavar="", help="Plain completion: no chat template.")
    ] = False,
    system: SystemOption = None,
    *,
    sampling: SamplingOptions,
    engine_options: EngineOptions,
    stats: StatsOption = False,
) -> None:
    """Generate an answer to PROMPT, streamed to stdout as tokens arrive.

    The chat template wraps PROMPT as a user message (after --system, if given) unless --raw;
    a base model without a chat template completes PROMPT as raw text (and says so on stderr).

    Defaults: greedy (temperature 0, reproducible), at most 128 new tokens, end-of-turn stops.

    Errors print one line to stderr and exit 1 (2 for an invalid or missing --backend / --device).
    """
    with cli_errors():
        params = sampling.sampling_params()
        if raw and system is not None:
            raise ValueError("--system needs the chat template; drop --raw")
        engine = engine_options.build_engine()
        tokenizer = engine.tokenizer
        if not raw and not tokenizer.chat_template:
            from pagedattn.model.tokenizer import NO_CHAT_TEMPLATE

            if system is not None:
                raise ValueError(f"--system needs a chat template; {NO_CHAT_TEMPLATE}")
            print(f"({NO_CHAT_TEMPLATE}: completing PROMPT as is)", file=sys.stderr, flush=True)
            raw = True
        if raw:
            ids = engine.encode(prompt)
        else:
            messages = [{"role": "system", "content": system}] if system is not None else []
            messages.append({"role": "user", "content": prompt})
            ids = tokenizer.encode_chat(messages)

        from pagedattn.cli.stream import format_stats, stream_request, warm_up

        warmup_s = warm_up(engine) if stats else None
        try:
            result = stream_request(engine, ids, params, _write)
        finally:
            engine.close()  # the queued kv-store writes land before the process exits
        result.warmup_s = warmup_s
        _write("\n")
        if result.error:
            raise ValueError(result.error)
        if stats:
            print(format_stats(result), file=sys.stderr, flush=True)
