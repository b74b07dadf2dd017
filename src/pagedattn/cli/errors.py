"""How the commands report expected failures: one line on stderr naming the flag, an exit code.

Values are validated by the configs themselves (``CacheConfig``, ``SamplingParams``) so that a
bad value gives the same one-line message from every entry point; :func:`cli_errors` prints it
with the config field replaced by its flag (``CacheConfig.page_size`` -> ``--page-size``) and
exits 1.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

# config field -> the flag that sets it (messages name what the user typed)
FLAGS = {
    "page_size": "--page-size",
    "num_pages": "--num-pages",
    "kv_cache_mib": "--kv-cache-mib",
    "kv_cache_dtype": "--kv-cache-dtype",
    "sliding_window": "--sliding-window",
    "num_sink_tokens": "--sinks",
    "position_mode": "--position-mode",
    "enable_prefix_caching": "--prefix-caching",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "speculative": "--speculative",
    "seed": "--seed",
    "model": "--model",
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "kv_store": "--kv-store",
    "kv_store_key": "--kv-store-key",
    "kv_store_deadline_s": "--kv-store-deadline",
}
_CONFIG_FIELD = re.compile(r"\b(?:CacheConfig|SchedulerConfig|EngineConfig)\.(\w+)")
_LEADING_FIELD = re.compile(r"^(\w+):")


def flag_message(message: str) -> str:
    """``message`` with config field names replaced by their flags: ``CacheConfig.page_size``
    -> ``--page-size``, a leading ``temperature:`` -> ``--temperature:``; values that the
    configs spell differently are noted (``sliding_window ... None`` means 0)."""
    message = _CONFIG_FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(0)), message)
    message = _LEADING_FIELD.sub(lambda m: f"{FLAGS.get(m.group(1), m.group(1))}:", message)
    return message.replace("needs sliding_window (got None)", "needs --sliding-window > 0")


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn expected failures (bad values, missing model files) into one line on stderr (config
    fields named by their flags, see :func:`flag_message`) and exit code 1, without a
    traceback; a backend or device that is invalid or missing exits 2. Ctrl-C exits 130."""
    from pagedattn.backends import BackendError

    try:
        yield
    except BackendError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        raise typer.Exit(code=2) from None
    except (ValueError, FileNotFoundError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        message = flag_message(message)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        print("", file=sys.stderr, flush=True)
        raise typer.Exit(code=130) from None
