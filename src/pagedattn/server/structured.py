"""Structured output for the HTTP routes: request fields -> a guided-decoding logits processor.

Fields (at most one per request; two is a 400):

- OpenAI ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``.
- vLLM ``guided_json`` (a schema, or its JSON text), ``guided_regex``, ``guided_choice`` (a list
  of strings), ``guided_grammar`` (a Lark grammar, llguidance's dialect), and the same under
  their current spelling ``structured_outputs`` (:mod:`pagedattn.server.structured_outputs`).
- vLLM's structural tag, as ``structured_outputs.structural_tag`` or ``response_format:
  {"type": "structural_tag", "structures", "triggers"}``: free text with JSON segments that
  open on a trigger (:mod:`pagedattn.server.structural_tag`).

JSON is laid out as ``{"a": 1, "b": [1, 2]}`` with no other whitespace unless
``guided_whitespace_pattern`` (a regex, JSON kinds only) says what whitespace may appear
between tokens; ``guided_decoding_backend`` may only name this server's backend
(``guidance``/``llguidance``/``auto``). Masks come from llguidance (see
:mod:`pagedattn.engine.guided`); a schema, regex or grammar it cannot compile is a 400 naming
the field, and so is one that admits no output at all (a schema that only refers to itself,
``{"$ref": "#"}``, or a cycle of ``$ref`` s with no other branch): the first token's mask is
computed before the request reaches the engine. A recursive schema with a base case (a tree
whose children are optional) is served.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pagedattn.server.protocol as p
from pagedattn.engine.guided import GrammarCompiler, GuidedSpec
from pagedattn.sampling_params import LogitsProcessor
from pagedattn.server.errors import APIError
from pagedattn.server.structural_tag import (
    Vocabulary,
    parse_structural_tag,
    structural_tag_grammar,
)
from pagedattn.server.structured_outputs import StructuredOutputs, no_additional_properties

BACKENDS = (None, "auto", "guidance", "llguidance")
COMPILE_ONLY = Vocabulary()  # no special tokens; schemas compiled without a tokenizer


def guided_spec(req: p.SamplingFields, vocabulary: Vocabulary = COMPILE_ONLY) -> GuidedSpec | None:
    """The request's structured-output constraint, or None.

    Args:
        vocabulary: the model's special tokens and schema check (for a structural tag).

    Raises:
        APIError: 400 when two constraints are given, a ``json_schema`` format has no schema,
            or an unsupported option is set.
    """
    if req.guided_decoding_backend not in BACKENDS:
        raise APIError(
            400,
            f"guided_decoding_backend: this server uses llguidance; got "
            f"{req.guided_decoding_backend!r}",
            param="guided_decoding_backend",
        )
    specs: list[GuidedSpec] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        specs.append(GuidedSpec("json_object", None, "response_format"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise APIError(
                400,
                "response_format: type 'json_schema' needs json_schema.schema",
                param="response_format",
            )
        specs.append(GuidedSpec("json", fmt.json_schema.json_schema, "response_format"))
    elif fmt is not None and fmt.type == "structural_tag":
        if fmt.json_schema is not None:
            raise APIError(
                400,
                "response_format.json_schema: not part of a structural tag",
                param="response_format.json_schema",
            )
        tag = parse_structural_tag({"type": fmt.type, **(fmt.model_extra or {})}, "response_format")
        grammar = structural_tag_grammar(tag, "response_format", vocabulary)
        specs.append(GuidedSpec("grammar", grammar, "response_format"))
    if req.guided_json is not None:
        specs.append(GuidedSpec("json", req.guided_json, "guided_json"))
    if req.guided_regex is not None:
        specs.append(GuidedSpec("regex", req.guided_regex, "guided_regex"))
    if req.guided_choice is not None:
        specs.append(GuidedSpec("choice", req.guided_choice, "guided_choice"))
    if req.guided_grammar is not None:
        specs.append(GuidedSpec("grammar", req.guided_grammar, "guided_grammar"))
    specs += structured_output_specs(req.structured_outputs, vocabulary)
    ws_field, ws = "guided_whitespace_pattern", req.guided_whitespace_pattern
    so_ws = None if req.structured_outputs is None else req.structured_outputs.whitespace_pattern
    if so_ws is not None:
        if ws is not None:
            raise APIError(
                400,
                "structured_outputs.whitespace_pattern: give it or guided_whitespace_pattern, "
                "not both",
                param="structured_outputs.whitespace_pattern",
            )
        ws_field, ws = "structured_outputs.whitespace_pattern", so_ws
    if len(specs) > 1:
        names = ", ".join(s.field for s in specs)
        raise APIError(
            400,
            f"{specs[1].field}: only one structured output constraint per request, got {names}",
            param=specs[1].field,
        )
    if not specs:
        if ws is not None:
            raise APIError(400, f"{ws_field}: needs a JSON constraint", param=ws_field)
        return None
    spec = specs[0]
    if ws is None:
        return spec
    if spec.kind not in ("json", "json_object"):
        raise APIError(
            400,
            f"{ws_field}: only applies to JSON output, not {spec.field}",
            param=ws_field,
        )
    return GuidedSpec(spec.kind, spec.value, spec.field, ws)


FIELD = "structured_outputs"


def structured_output_specs(
    fields: StructuredOutputs | None, vocabulary: Vocabulary = COMPILE_ONLY
) -> list[GuidedSpec]:
    """The constraints ``structured_outputs`` asks for (each :class:`GuidedSpec` names its
    sub-field, e.g. ``structured_outputs.json``); whitespace is applied by the caller.

    Raises:
        APIError: 400 for a structural tag that is not valid, a JSON schema given as text that
            is not JSON, or ``disable_additional_properties`` without a JSON schema or
            structural tag.
    """
    if fields is None:
        return []
    specs = []
    if fields.structural_tag is not None:
        where = f"{FIELD}.structural_tag"
        tag = parse_structural_tag(fields.structural_tag, where)
        closed = fields.disable_additional_properties
        grammar = structural_tag_grammar(tag, where, vocabulary, closed)
        specs.append(GuidedSpec("grammar", grammar, where))
    if fields.json_schema is not None:
        schema: Any = fields.json_schema
        if fields.disable_additional_properties:
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as exc:
                    raise APIError(
                        400, f"{FIELD}.json: not a JSON schema: {exc}", param=f"{FIELD}.json"
                    ) from exc
            schema = no_additional_properties(schema)
        specs.append(GuidedSpec("json", schema, f"{FIELD}.json"))
    elif fields.disable_additional_properties and fields.structural_tag is None:
        raise APIError(
            400,
            f"{FIELD}.disable_additional_properties: needs a JSON schema ({FIELD}.json) or a "
            "structural tag",
            param=f"{FIELD}.disable_additional_properties",
        )
    if fields.regex is not None:
        specs.append(GuidedSpec("regex", fields.regex, f"{FIELD}.regex"))
    if fields.choice is not None:
        specs.append(GuidedSpec("choice", fields.choice, f"{FIELD}.choice"))
    if fields.grammar is not None:
        specs.append(GuidedSpec("grammar", fields.grammar, f"{FIELD}.grammar"))
    if fields.json_object:
        specs.append(GuidedSpec("json_object", None, f"{FIELD}.json_object"))
    return specs


class StructuredOutput:
    """Builds per-request guided-decoding processors for one engine's tokenizer.

    Args:
        tokenizer: the engine's tokenizer (None: every constrained request is a 400).
        vocab_size: the model's logits width.
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compiler(self, field: str) -> GrammarCompiler:
        """The grammar compiler (created on first use). Raises APIError 400 without one."""
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise APIError(400, f"{field}: needs a model with a tokenizer", param=field)
                try:
                    self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size)
                except ImportError as exc:
                    raise APIError(
                        400,
                        f"{field}: structured output needs llguidance "
                        "(pip install 'pagedattn[server]')",
                        param=field,
                    ) from exc
            return self._compiler

    def warm_up(self) -> None:
        """Build the grammar compiler and its token trie now (about a second for a 50k
        vocabulary), not inside the first chat request (every chat request reads its special
        tokens); nothing without a tokenizer or llguidance."""
        if self.tokenizer is None:
            return
        try:
            self.compiler("response_format").ll_tokenizer  # noqa: B018  (built on first read)
        except APIError:  # llguidance is not installed: constrained requests are 400s
            return

    def special_tokens(self, texts: tuple[str, ...], field: str = "tools") -> frozenset[str]:
        """Which of ``texts`` are one token llguidance treats as special (matched only by
        name in a grammar); ``field`` is named when there is no compiler."""
        ll_tok = self.compiler(field).ll_tokenizer
        found = set()
        for text in texts:
            token_id = self.tokenizer.backend.token_to_id(text)
            if token_id is not None and ll_tok.is_special_token(int(token_id)):
                found.add(text)
        return frozenset(found)

    def processors(
        self, req: p.SamplingFields, tool_spec: GuidedSpec | None = None
    ) -> tuple[LogitsProcessor, ...]:
        """The logits processors the request needs (empty without a constraint). Blocking
        (grammar compilation; the first call also builds the token trie, about 1-2 s).

        Args:
            req: the request.
            tool_spec: the grammar of the request's tool calls (:mod:`pagedattn.server.tools`).

        Raises:
            APIError: 400 from :func:`guided_spec`, a structured-output field together with
                tool calls, or a constraint that does not compile.
        """
        spec = guided_spec(req, self._vocabulary(req))
        if spec is not None and tool_spec is not None:
            raise APIError(
                400,
                f"{spec.field}: cannot be combined with tool calls (send tool_choice 'none')",
                param=spec.field,
            )
        spec = spec or tool_spec
        if spec is None:
            return ()
        return (self._compiled(spec),)

    def _compiled(self, spec: GuidedSpec) -> LogitsProcessor:
        """A processor for ``spec``. Raises APIError 400 naming ``spec.field`` when it does
        not compile or admits no output."""
        try:
            processor = self.compiler(spec.field).processor(spec)
        except ValueError as exc:
            raise APIError(400, str(exc), param=spec.field) from exc
        try:
            admits_output = bool(processor.allowed([]).any())
            problem = "no token can start it"
        except RuntimeError as exc:  # the grammar has no derivation: no first mask
            admits_output = False
            problem = str(exc).split("\n", 1)[0].strip()
        if not admits_output:
            raise APIError(
                400,
                f"{spec.field}: the constraint admits no output ({problem}); a schema that "
                "only refers to itself has no instance",
                param=spec.field,
            )
        return processor

    def _vocabulary(self, req: p.SamplingFields) -> Vocabulary:
        field = "response_format"
        if req.structured_outputs is not None and req.structured_outputs.structural_tag:
            field = f"{FIELD}.structural_tag"
        return Vocabulary(
            special=lambda texts: self.special_tokens(texts, field),
            check_schema=lambda schema, where: self._check_schema(schema, where),
        )

    def _check_schema(self, schema: dict[str, Any], where: str) -> None:
        self._compiled(GuidedSpec("json", schema, where))
