"""`pagedattn chat`: a multi-turn conversation on stdin/stdout that reuses its KV pages.

Each turn's prompt is the conversation's exact token ids so far (every earlier prompt id and
every generated id, the end-of-turn id included) extended by the token ids of the chat
template's text between the previous answer and the new assistant header. Re-tokenizing the
whole rendered conversation instead could split the answer differently from the ids the model
generated, which would break the prefix hash chain; keeping the ids makes every full page of
the history a prefix-cache hit (the pages of a finished request stay cached until LRU eviction
reuses them).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from pagedattn.cli.app import app
from pagedattn.cli.engine_options import SERVER_OPTIONS, EngineOptions
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.option_groups import option_group
from pagedattn.cli.options import ENGINE
from pagedattn.cli.sampling_options import SamplingOptions, StatsOption, SystemOption

PROMPT_MARKER = ">>> "
HELP_TEXT = "Type a message; /reset clears the conversation, /exit or Ctrl-D ends it."


@dataclass
class Conversation:
    """A chat's messages and the exact token ids the model has seen and generated.

    Attributes:
        tokenizer: ``pagedattn.model.tokenizer.Tokenizer`` with a chat template.
        system: optional system message, kept across ``reset``.
        messages: the conversation, oldest first.
        token_ids: prompt ids of the last turn + its generated ids ([] before the first turn).
        text: the text ``token_ids`` spell (special tokens included).
    """

    tokenizer: Any
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        self.token_ids, self.text = [], ""

    def prompt_for(self, user: str) -> tuple[list[int], str]:
        """Token ids (and their text) of the next prompt: history ids + template delta.

        Falls back to tokenizing the whole rendered conversation when the history text is
        not a prefix of it (e.g. the model emitted a special token the template renders
        differently); the prefix cache then still serves the pages that match.

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        messages: Sequence[Mapping[str, str]] = [*self.messages, {"role": "user", "content": user}]
        full = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if self.token_ids and full.startswith(self.text):
            delta = self.tokenizer.encode(full[len(self.text) :], add_special_tokens=False)
            return [*self.token_ids, *delta], full
        return self.tokenizer.encode(full, add_special_tokens=False), full

    def record(
        self, user: str, prompt_ids: list[int], prompt_text: str, answer_ids: list[int], answer: str
    ) -> None:
        """Append a finished turn: the user message, the answer and their exact ids."""
        self.messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
        self.token_ids = [*prompt_ids, *answer_ids]
        self.text = prompt_text + self.tokenizer.decode(answer_ids, skip_special_tokens=False)


def _resume(engine: Any, conversation: Conversation, session: str) -> bytes | None:
    """Load session ``session`` from the engine's kv store into ``conversation`` (if saved).

    Returns:
        The document as read (None: a new session), what the next save must still find.

    Raises:
        ValueError: a saved document that is not a valid session of this model, or one too
            large to be a session (refused unread).
    """
    from pagedattn.cli import session as sessions

    data = engine.kv_tier.store.get_document(sessions.document_name(session))
    if data is None:
        print(f"(new session {session!r})", file=sys.stderr, flush=True)
        return None
    doc = sessions.decode_session(data, engine.model_fingerprint, engine.model_config.vocab_size)
    conversation.messages = doc["messages"]
    conversation.token_ids = doc["token_ids"]
    conversation.text = doc["text"]
    turns = sum(m["role"] == "user" for m in conversation.messages)
    print(f"(resumed session {session!r}: {turns} turns)", file=sys.stderr, flush=True)
    return bytes(data)


class SessionConflictError(Exception):
    """Another process saved the session since this one read it."""


def _save(
    engine: Any, conversation: Conversation, session: str | None, read: bytes | None
) -> bytes | None:
    """Save the conversation under ``session`` (no-op without one) if the saved document is
    still ``read``, the one this process last read or wrote (a compare-and-swap: another
    process's turns are never overwritten). The turn's pages are already queued for the tier;
    the document is written now.

    Returns:
        The document now saved (``read`` when nothing was written).

    Raises:
        SessionConflictError: another process saved the session in between.
    """
    if session is None:
        return read
    from pagedattn.cli import session as sessions
    from pagedattn.storage.documents import DocumentConflictError

    data = sessions.encode_session(conversation, engine.model_fingerprint)
    try:
        engine.kv_tier.store.replace_document(sessions.document_name(session), read, data)
    except DocumentConflictError:
        raise SessionConflictError(
            f"session {session!r} was saved by another process since this one read it; this "
            f"turn is not saved. Start `pagedattn chat --session {session}` again to continue "
            "the saved conversation."
        ) from None
    except (OSError, ValueError) as exc:
        print(f"warning: session not saved: {exc}", file=sys.stderr, flush=True)
        return read
    return data


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command("chat")
@option_group(SamplingOptions, max_tokens=256)
@option_group(EngineOptions, omit=SERVER_OPTIONS)
def chat(
    system: SystemOption = None,
    *,
    sampling: SamplingOptions,
    engine_options: EngineOptions,
    session: Annotated[
        str | None,
        typer.Option(
            help="Save the conversation under NAME in the kv store and resume it on the next "
            "start (default store: the user cache folder).",
            rich_help_panel=ENGINE,
        ),
    ] = None,
    stats: StatsOption = False,
) -> None:
    """Chat with the model: one message per line on stdin, answers streamed to stdout.

    /reset clears the history, /exit or end of input (Ctrl-D) ends the chat.

    Every turn reuses the KV pages of the conversation so far (--stats shows how many prompt
    tokens came from the cache). Defaults: greedy (temperature 0), at most 256 tokens a turn.
    """
    from pagedattn.cli import session as sessions
    from pagedattn.cli.stream import format_stats, stream_request, warm_up

    with cli_errors():
        if session is not None:
            sessions.document_name(session)  # check the name before loading the model
            if engine_options.kv_store is None:
                default_store = str(sessions.default_store_dir())
                engine_options = dataclasses.replace(engine_options, kv_store=default_store)
        params = sampling.sampling_params()
        engine = engine_options.build_engine()
        if not engine.tokenizer.chat_template:
            from pagedattn.model.tokenizer import NO_CHAT_TEMPLATE

            engine.close()
            raise ValueError(
                f"chat needs a chat template; {NO_CHAT_TEMPLATE} (use `pagedattn generate`)"
            )
        conversation = Conversation(engine.tokenizer, system)
        conversation.prompt_for("")  # fail now if the model has no template
        saved = None if session is None else _resume(engine, conversation, session)
        warmup_s = warm_up(engine) if stats else None
        print(HELP_TEXT, file=sys.stderr, flush=True)
        try:
            while True:
                _write(PROMPT_MARKER)
                line = sys.stdin.readline()
                if not line:  # end of input
                    _write("\n")
                    return
                user = line.rstrip("\r\n")
                command = user.strip()
                if command == "/exit":
                    return
                if command == "/reset":
                    conversation.reset()
                    saved = _save(engine, conversation, session, saved)
                    print("(conversation cleared)", file=sys.stderr, flush=True)
                    continue
                if not command:
                    continue
                ids, text = conversation.prompt_for(user)
                try:
                    result = stream_request(engine, ids, params, _write)
                except KeyboardInterrupt:
                    print("\n(interrupted; the turn was dropped)", file=sys.stderr, flush=True)
                    continue
                _write("\n")
                if result.error:
                    print(f"error: {result.error} (use /reset)", file=sys.stderr, flush=True)
                    continue
                conversation.record(user, ids, text, result.token_ids, result.text)
                saved = _save(engine, conversation, session, saved)
                if stats:
                    result.warmup_s, warmup_s = warmup_s, None  # reported with the first turn
                    print(format_stats(result), file=sys.stderr, flush=True)
        except SessionConflictError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise typer.Exit(1) from None
        finally:
            engine.close()  # the queued kv-store writes land before the process exits
