"""Structured output: token masks from a grammar, applied as a logits processor.

A :class:`GuidedSpec` names what the output must match (a JSON schema, any JSON object, a
regular expression, one of a list of strings, or a Lark grammar). :class:`GrammarCompiler`
turns it into a grammar for `llguidance <https://github.com/guidance-ai/llguidance>`_ (the
Earley parser + derivative-regex lexer of the Guidance project, as used by vLLM's ``guidance``
backend), and :class:`GuidedLogitsProcessor` is the ``SamplingParams.logits_processors`` entry
that, before each sampled token, sets the logits of every token the grammar cannot accept next
to ``-inf``. Once the grammar is complete only the end-of-sequence token(s) stay allowed, so a
bounded grammar always ends with finish reason ``stop``.

The processor is stateful (one ``LLMatcher`` per request) but derives its state from the
generated ids it is given: when they do not extend what it consumed (an ``n > 1`` child request
sharing the processor, a preempted request), it rolls back to the longest common prefix and
consumes the rest, so it never masks with the wrong state.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pagedattn.engine.outputs import DeadEndError
from pagedattn.engine.schema_instances import prune_infinite

GuidedKind = Literal["json", "json_object", "regex", "choice", "grammar"]

# JSON layout: ``{"a": 1, "b": [1, 2]}`` (OpenAI's and Python's json.dumps separators) and no
# other whitespace, so that a bounded schema bounds the output (llguidance's default allows
# any run of whitespace between tokens, which small models can fill forever).
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def narrow_one_of(schema: Any) -> Any:
    """``schema`` with every ``oneOf`` branch that is an object schema without
    ``additionalProperties`` given ``additionalProperties: false``.

    llguidance serves a ``oneOf`` only when it can prove its branches disjoint (then it is an
    ``anyOf``). Object branches with different required keys overlap only through extra keys;
    closing them makes the branches disjoint while every output stays valid for the original
    schema (a narrowing, never a widening). Branches that still overlap (``integer`` against
    ``number``, objects with the same keys) stay a compile error. A JSON text schema is parsed
    first; anything else is returned as it is.
    """
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except ValueError:
            return schema  # llguidance names the syntax error
        return narrow_one_of(parsed) if isinstance(parsed, dict) else schema
    return _narrow(schema, in_one_of=False)


def _narrow(node: Any, in_one_of: bool) -> Any:
    if isinstance(node, list):
        return [_narrow(x, in_one_of) for x in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _narrow(v, in_one_of=k == "oneOf") if k != "properties" else _narrow_props(v)
        for k, v in node.items()
    }
    is_object = out.get("type") == "object" or "properties" in out
    if in_one_of and is_object and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _narrow_props(props: Any) -> Any:
    if not isinstance(props, dict):
        return props
    return {k: _narrow(v, in_one_of=False) for k, v in props.items()}


@dataclass(frozen=True)
class GuidedSpec:
    """What the generated text must match.

    Attributes:
        kind: ``"json"`` (``value`` is a JSON schema, a dict or its JSON text),
            ``"json_object"`` (any JSON object; ``value`` unused), ``"regex"`` (``value`` is a
            regular expression, Rust ``regex`` syntax, matched against the whole output),
            ``"choice"`` (``value`` is a non-empty list of strings; the output is exactly one
            of them) or ``"grammar"`` (``value`` is a Lark grammar in llguidance's dialect).
        value: see ``kind``.
        field: the request field the spec came from, named in errors (e.g.
            ``"response_format"``, ``"guided_json"``).
        whitespace_pattern: JSON kinds only: a regex for the whitespace allowed between JSON
            tokens (vLLM's ``guided_whitespace_pattern``), instead of :data:`JSON_LAYOUT`.
    """

    kind: GuidedKind
    value: Any = None
    field: str = "guided"
    whitespace_pattern: str | None = None

    def _json_options(self) -> Any:
        if self.whitespace_pattern is None:
            return dict(JSON_LAYOUT)
        return {"whitespace_flexible": True, "whitespace_pattern": self.whitespace_pattern}

    def grammar(self) -> str:
        """The llguidance grammar text of this spec.

        Raises:
            ValueError: a value of the wrong type for ``kind``, naming ``field``.
        """
        import llguidance as llg

        if self.whitespace_pattern is not None and self.kind not in ("json", "json_object"):
            raise ValueError("guided_whitespace_pattern: only applies to JSON output")
        if self.kind == "json_object":
            schema: Any = {"type": "object"}
            return str(llg.LLMatcher.grammar_from_json_schema(schema, self._json_options()))
        if self.kind == "json":
            if not isinstance(self.value, (dict, str)):
                raise ValueError(f"{self.field}: expected a JSON schema object")
            try:
                schema = prune_infinite(narrow_one_of(self.value))
                return str(llg.LLMatcher.grammar_from_json_schema(schema, self._json_options()))
            except ValueError as exc:
                raise ValueError(f"{self.field}: invalid JSON schema: {exc}") from exc
        if self.kind == "regex":
            if not isinstance(self.value, str) or not self.value:
                raise ValueError(f"{self.field}: expected a non-empty regular expression")
            return str(llg.LLMatcher.grammar_from_regex(self.value))
        if self.kind == "choice":
            choices = self.value
            if (
                not isinstance(choices, (list, tuple))
                or not choices
                or not all(isinstance(c, str) and c for c in choices)
            ):
                raise ValueError(f"{self.field}: expected a non-empty list of non-empty strings")
            alternatives = " | ".join(json.dumps(c) for c in choices)
            return str(llg.LLMatcher.grammar_from_lark(f"start: {alternatives}\n"))
        if self.kind == "grammar":
            if not isinstance(self.value, str) or not self.value.strip():
                raise ValueError(f"{self.field}: expected a non-empty Lark grammar")
            return str(llg.LLMatcher.grammar_from_lark(self.value))
        raise ValueError(f"{self.field}: unknown structured output kind {self.kind!r}")


class GrammarCompiler:
    """Compiles :class:`GuidedSpec` s for one tokenizer.

    Building llguidance's token trie takes about a second for a 50k vocabulary; it is done
    once, at the first :meth:`processor` call (thread-safe).

    Args:
        tokenizer: a :class:`pagedattn.model.tokenizer.Tokenizer` (its ``backend`` is serialized
            to llguidance; ``stop_token_ids`` are the tokens allowed once the grammar is done).
        vocab_size: the model's logits width (may exceed the tokenizer's: padded embedding rows
            are always masked); None = the tokenizer's.

    Raises:
        ImportError: llguidance is not installed (``pip install 'pagedattn[server]'``).
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        import llguidance  # noqa: F401  (fail at construction, not at the first request)

        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None

    @property
    def ll_tokenizer(self) -> Any:
        """The ``llguidance.LLTokenizer`` (built on first use)."""
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance as llg

                tok = self.tokenizer
                self._ll_tokenizer = llg.LLTokenizer(
                    tok.backend.to_str(),
                    n_vocab=tok.vocab_size,
                    eos_token=sorted(tok.stop_token_ids),
                )
            return self._ll_tokenizer

    def processor(self, spec: GuidedSpec) -> GuidedLogitsProcessor:
        """A fresh processor (own matcher) for one request.

        Raises:
            ValueError: the spec does not compile (invalid schema, regex or grammar, or a
                feature llguidance does not support), naming ``spec.field``.
        """
        import llguidance as llg

        grammar = spec.grammar()
        ll_tok = self.ll_tokenizer
        error = llg.LLMatcher.validate_grammar(grammar, ll_tok)
        if error:
            raise ValueError(f"{spec.field}: {error}")
        matcher = llg.LLMatcher(ll_tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"{spec.field}: {matcher.get_error()}")
        eos = sorted(self.tokenizer.stop_token_ids)
        width = self.vocab_size or int(self.tokenizer.vocab_size)
        processor = GuidedLogitsProcessor(matcher, int(ll_tok.vocab_size), width, eos)
        processor.spec = spec
        return processor


class GuidedLogitsProcessor:
    """``(generated_ids, logits_row) -> logits_row`` with every disallowed token at ``-inf``.

    Args:
        matcher: an ``llguidance.LLMatcher`` at the start of the output.
        num_tokens: the tokenizer's vocabulary size (the mask's width).
        vocab_size: the logits width; ids ``>= num_tokens`` are always masked.
        eos_token_ids: the ids allowed once the grammar has completed.

    Raises (at call time):
        RuntimeError: the generated ids contain a token the grammar rejects (only possible when
            the row was sampled without this mask) or the grammar hit a parser limit.
    """

    def __init__(
        self, matcher: Any, num_tokens: int, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        self.matcher = matcher
        self.num_tokens = num_tokens
        self.vocab_size = vocab_size
        self.eos_token_ids = np.asarray(list(eos_token_ids), dtype=np.int64)
        self.consumed: list[int] = []
        self.spec: GuidedSpec | None = None  # what it was compiled from (rebuilt elsewhere)
        self._bitmask = np.zeros(((num_tokens + 31) // 32,), dtype=np.int32)

    def _sync(self, generated: Sequence[int]) -> None:
        """Bring the matcher to the state after ``generated`` (rollback + consume)."""
        common = 0
        limit = min(len(self.consumed), len(generated))
        while common < limit and self.consumed[common] == generated[common]:
            common += 1
        if common < len(self.consumed):
            back = len(self.consumed) - common
            if not self.matcher.rollback(back):
                raise RuntimeError(f"guided decoding: rollback failed: {self.matcher.get_error()}")
            del self.consumed[common:]
        for token in generated[common:]:
            if self.matcher.is_stopped():
                break  # tokens after completion (only EOS, kept by ignore_eos) change nothing
            if not self.matcher.consume_token(int(token)):
                error = self.matcher.get_error()
                if "limit" in error:  # the parser's item / depth limits, not a bad token
                    raise DeadEndError(f"guided decoding: {error}")
                raise RuntimeError(f"guided decoding: token {int(token)} rejected: {error}")
            self.consumed.append(int(token))

    def allowed(self, generated: Sequence[int]) -> np.ndarray:
        """(vocab_size,) bool: the tokens the grammar accepts after ``generated``."""
        self._sync(generated)
        out = np.zeros(self.vocab_size, dtype=bool)
        if self.matcher.is_stopped():
            out[self.eos_token_ids[self.eos_token_ids < self.vocab_size]] = True
            return out
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if self.matcher.is_error():
            error = self.matcher.get_error()
            if "limit" in error:
                raise DeadEndError(f"guided decoding: {error}")
            raise RuntimeError(f"guided decoding: {error}")
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        n = min(self.num_tokens, self.vocab_size)
        out[:n] = bits[:n].astype(bool)
        return out

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> np.ndarray:
        """Mask ``logits`` ((vocab_size,) float) in place and return it."""
        if logits.shape != (self.vocab_size,):
            raise ValueError(f"logits: expected shape ({self.vocab_size},), got {logits.shape}")
        logits[~self.allowed(generated)] = -np.inf
        return logits
