"""Per-token cost of structured output: the same batch of requests decoded with and without
a JSON-schema token mask, on one engine, in one process.

Method: ``num_requests`` chat requests (greedy) ask for a JSON list of records under a bounded
schema; the constrained run stops when each grammar completes. The unconstrained run then
generates exactly as many tokens per request (``ignore_eos``, ``max_tokens`` = that request's
constrained count), so both runs do the same model work and the difference is the mask: the
llguidance mask computation, its application to the logits row, and the row copy the sampler
makes for processors. A warm-up request runs first (kernel compile / cache load). Reported:
seconds per generated token of each run, their ratio, and the mask's own time per token
(measured inside the processor).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 6,
    "maxItems": 6,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 999},
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "active": {"type": "boolean"},
        },
        "required": ["id", "name", "active"],
        "additionalProperties": False,
    },
}


@dataclass
class StructuredBenchResult:
    """Figures of one run (seconds, tokens)."""

    num_requests: int
    tokens_generated: int
    constrained_s: float
    unconstrained_s: float
    mask_s: float
    all_valid: bool

    @property
    def constrained_ms_per_token(self) -> float:
        return 1e3 * self.constrained_s / self.tokens_generated

    @property
    def unconstrained_ms_per_token(self) -> float:
        return 1e3 * self.unconstrained_s / self.tokens_generated

    @property
    def mask_ms_per_token(self) -> float:
        return 1e3 * self.mask_s / self.tokens_generated

    @property
    def ratio(self) -> float:
        """Constrained over unconstrained time per token (1.0 = free)."""
        return self.constrained_s / self.unconstrained_s

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "constrained_ms_per_token": self.constrained_ms_per_token,
            "unconstrained_ms_per_token": self.unconstrained_ms_per_token,
            "mask_ms_per_token": self.mask_ms_per_token,
            "ratio": self.ratio,
        }


class _Timed:
    """Wraps a logits processor and adds up the seconds spent in it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __call__(self, generated: Any, logits: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = self.inner(generated, logits)
        self.seconds += time.perf_counter() - start
        return np.asarray(out)


def _run(engine: Any, prompts: list[list[int]], params: list[Any]) -> tuple[float, dict]:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    text: dict[str, str] = {i: "" for i in ids}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.outputs[0].token_ids
            text[out.request_id] += out.outputs[0].text
    elapsed = time.perf_counter() - start
    return elapsed, {i: (tokens[i], text[i]) for i in ids}


def run_structured_bench(
    engine: Any, num_requests: int = 8, max_tokens: int = 256
) -> StructuredBenchResult:
    """Run both sides on ``engine`` (idle, with a tokenizer, prefix caching off so that neither
    run reuses the other's prompt pages) and return the figures.

    Raises:
        ValueError: ``num_requests`` < 1 or ``max_tokens`` < 1.
    """
    import json

    import jsonschema

    from pagedattn.engine.guided import GrammarCompiler, GuidedSpec
    from pagedattn.sampling_params import SamplingParams

    if num_requests < 1 or max_tokens < 1:
        raise ValueError("num_requests and max_tokens must be >= 1")
    tok = engine.tokenizer
    prompts = [
        tok.encode_chat(
            [{"role": "user", "content": f"List six users of club number {i} as JSON."}]
        )
        for i in range(num_requests)
    ]
    compiler = GrammarCompiler(tok, engine.model_config.vocab_size)
    spec = GuidedSpec("json", SCHEMA, "bench")
    warm = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, seed=0)
    _run(engine, prompts[:1], [warm])  # kernels compiled / loaded; trie built below
    compiler.processor(spec)

    timed = [_Timed(compiler.processor(spec)) for _ in prompts]
    constrained = [
        SamplingParams(temperature=0.0, max_tokens=max_tokens, logits_processors=(t,))
        for t in timed
    ]
    c_s, c_out = _run(engine, prompts, constrained)
    counts = [len(c_out[k][0]) for k in c_out]
    valid = True
    for _, text in c_out.values():
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            valid = False
    free = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in counts]
    u_s, _ = _run(engine, prompts, free)
    return StructuredBenchResult(
        num_requests=num_requests,
        tokens_generated=sum(counts),
        constrained_s=c_s,
        unconstrained_s=u_s,
        mask_s=sum(t.seconds for t in timed),
        all_valid=valid,
    )
