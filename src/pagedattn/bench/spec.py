"""`pagedattn bench spec`: our single-stream decode tok/s with n-gram speculation against the same
engine without it, on input-grounded requests and on free chat, runs interleaved in one process.

Grounded requests ask the model to repeat, quote or summarise a passage of the shipped novel,
rewrite a JSON document and edit a code file: the answer copies its input, which is where
drafts from the request's own prompt pay. Free chat answers open questions. Every request runs
alone and greedy; the two engines share one model; each round runs every request without, then
with speculation. The outputs must be identical (speculation is lossless): any difference is
reported.

Each task also gets its n-gram ceiling (:func:`ngram_ceiling`): the speedup speculation would
reach if verify rows cost nothing and every draft were cut exactly where the model leaves it,
from the plain output replayed through the drafter's own lookup. A token the lookup cannot
predict needs a step of its own, so the ceiling says how much of the answer the request copies
from its context; the measured ratio is what the verify rows' cost and imperfect draft lengths
leave of it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from pagedattn.bench.corpus import default_corpus_file
from pagedattn.engine.spec.ngram import NgramIndex
from pagedattn.sampling_params import SamplingParams

CODE = '''def total_price(items, tax_rate):
    """Sum of the item prices with tax."""
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
'''
DOC = {
    "order": 1042,
    "customer": {"name": "Elizabeth Bennet", "city": "Longbourn"},
    "items": [
        {"name": "bonnet", "price": 12.5, "quantity": 1},
        {"name": "gloves", "price": 4.25, "quantity": 2},
    ],
    "paid": False,
}
FREE_CHAT = [
    "What are three good habits for staying healthy?",
    "Write a short poem about the sea.",
    "Why is the sky blue? Explain simply.",
    "Give me some ideas for a birthday party.",
]
GROUNDED_TASKS = ("repeat", "quote", "summarise", "json", "code")  # workloads()'s order


def passages(count: int, lines: int = 8) -> list[str]:
    """``count`` passages of the shipped novel, ``lines`` printed lines each, from its body."""
    text = default_corpus_file().read_text(encoding="utf-8").splitlines()
    body = [line for line in text if line.strip()]
    step = len(body) // (count + 1)
    return [" ".join(body[(i + 1) * step : (i + 1) * step + lines]) for i in range(count)]


def workloads() -> dict[str, list[str]]:
    """User messages by workload: grounded (quote, repeat, summarise, JSON, code) and free."""
    p = passages(3)
    grounded = [
        f"Repeat the following passage exactly, word for word:\n\n{p[0]}",
        f"Quote the following passage in full, then say who is speaking:\n\n{p[1]}",
        f"Summarise this passage, quoting its key sentences:\n\n{p[2]}",
        'Rewrite this JSON with the key "paid" set to true, keeping everything else:\n\n'
        + json.dumps(DOC, indent=2),
        f"Rename the variable `subtotal` to `net` in this code and show the full file:\n\n{CODE}",
    ]
    return {"grounded": grounded, "free chat": list(FREE_CHAT)}


def ngram_ceiling(
    prompt: list[int], output: list[int], ngram_min: int, ngram_max: int, most: int
) -> tuple[int, int]:
    """(decode tokens, steps) of ``output`` with free verify rows and perfect draft lengths.

    Replays the greedy ``output`` (its first token comes from the prefill) through an
    :class:`NgramIndex`: at each step the lookup's up to ``most`` drafts are kept as far as
    they equal the output, so the step gains one token plus those. ``tokens / steps`` is the
    most any draft policy can gain over plain decoding (one step per token) with this lookup.
    """
    index = NgramIndex(ngram_min, ngram_max)
    g, steps = 1, 0
    while g < len(output):
        draft = index.propose(prompt + output[:g], min(most, len(output) - g - 1))
        kept = 0
        while kept < len(draft) and draft[kept] == output[g + kept]:
            kept += 1
        g += 1 + kept
        steps += 1
    return max(len(output) - 1, 0), steps


@dataclass
class Totals:
    """Decode tokens and seconds summed over requests, and the drafts' acceptance."""

    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    ceiling_steps: int = 0  # steps with free verify rows and perfect drafts (off only)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def cpu_tok_s(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def ceiling(self) -> float:
        return self.tokens / self.ceiling_steps if self.ceiling_steps else 1.0


def decode_one(engine: Any, ids: list[int], max_tokens: int) -> tuple[list[int], int, float, float]:
    """Run one greedy request alone: (tokens, decode tokens, first token -> last token s, and
    the process's CPU seconds over the same span)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.add_request(ids, params, request_id="bench")
    tokens: list[int] = []
    first = last = first_cpu = last_cpu = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            new = out.outputs[0].token_ids
            if new:
                now, cpu = time.perf_counter(), time.process_time()
                if first is None:
                    first, first_cpu = now, cpu
                last, last_cpu = now, cpu
                tokens += new
    assert first is not None and last is not None
    assert first_cpu is not None and last_cpu is not None
    # Tokens after the first, over the time they took (the first comes from the prefill).
    return tokens, len(tokens) - 1, last - first, last_cpu - first_cpu


def run_spec_bench(
    model: str | None = None,
    *,
    rounds: int = 2,
    max_tokens: int = 128,
    num_speculative_tokens: int = 8,
    activations: str = "float32",
) -> dict[str, Any]:
    """Measure decode tok/s with and without speculation (see the module doc), the model's
    projections on ``activations`` (float32, or int8 as ``--activations int8``).

    Returns:
        ``{workload: {"off": tok/s, "on": tok/s, "ratio": on/off, "cpu_ratio": the same in
        process CPU time, "acceptance": accepted/drafted, "ceiling": n-gram ceiling,
        "identical": bool}}`` for "grounded", "free chat", then each grounded task
        (:data:`GROUNDED_TASKS`).
    """
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.model.build import build_model, resolve_model_backend
    from pagedattn.model.loader import load_model

    loaded = load_model(model)
    net = build_model(loaded, resolve_model_backend("numpy", None), activations=activations)
    common: dict[str, Any] = {
        "enable_prefix_caching": False,
        "max_num_seqs": 1,
        "activations": activations,
    }
    engines = {
        "off": LLMEngine(engine_config(model, speculative="none", **common), net, loaded.tokenizer,
                         model_fingerprint=loaded.fingerprint),
        "on": LLMEngine(
            engine_config(model, speculative="ngram",
                          num_speculative_tokens=num_speculative_tokens, **common),
            net, loaded.tokenizer, model_fingerprint=loaded.fingerprint,
        ),
    }  # fmt: skip
    tok = loaded.tokenizer
    prompts = {
        name: [tok.encode_chat([{"role": "user", "content": m}]) for m in msgs]
        for name, msgs in workloads().items()
    }
    decode_one(engines["off"], prompts["free chat"][0], 8)  # compile / warm up both paths
    decode_one(engines["on"], prompts["grounded"][0], 8)
    labels = {"grounded": GROUNDED_TASKS, "free chat": ("free chat",) * len(FREE_CHAT)}
    c = engines["on"].config.scheduler
    totals: dict[tuple[str, str], Totals] = {}
    for _ in range(rounds):
        for name, ids_list in prompts.items():
            for ids, task in zip(ids_list, labels[name], strict=True):
                for mode, engine in engines.items():
                    before = engine.get_stats()
                    out, n, secs, cpu = decode_one(engine, ids, max_tokens)
                    after = engine.get_stats()
                    for key in (name, task) if task != name else (name,):
                        t = totals.setdefault((key, mode), Totals())
                        t.tokens += n
                        t.seconds += secs
                        t.cpu_seconds += cpu
                        t.drafted += (
                            after["spec_num_drafted_tokens"] - before["spec_num_drafted_tokens"]
                        )
                        t.accepted += (
                            after["spec_num_accepted_tokens"] - before["spec_num_accepted_tokens"]
                        )
                        if mode == "off":
                            t.ceiling_steps += ngram_ceiling(
                                ids, out, c.ngram_min, c.ngram_max, c.num_speculative_tokens
                            )[1]
                        t.outputs.append(out)
    results: dict[str, Any] = {}
    for name in [*prompts, *GROUNDED_TASKS]:
        off, on = totals[(name, "off")], totals[(name, "on")]
        results[name] = {
            "off": off.tok_s,
            "on": on.tok_s,
            "ratio": on.tok_s / off.tok_s if off.tok_s else 0.0,
            "cpu_ratio": on.cpu_tok_s / off.cpu_tok_s if off.cpu_tok_s else 0.0,
            "acceptance": on.accepted / on.drafted if on.drafted else 0.0,
            "drafted": on.drafted,
            "ceiling": off.ceiling,
            "identical": off.outputs == on.outputs,
            "requests": len(off.outputs),
        }
    return results


def report(results: dict[str, Any]) -> str:
    """The results as the lines `pagedattn bench spec` prints."""
    lines = [
        f"{'workload':<10} {'off tok/s':>10} {'on tok/s':>10} {'ratio':>7} {'cpu':>7}  "
        f"{'accept':>6}  {'ceiling':>7}  outputs"
    ]
    for name, r in results.items():
        same = "identical" if r["identical"] else "DIFFER"
        label = name if name in ("grounded", "free chat") else f"  {name}"
        lines.append(
            f"{label:<10} {r['off']:>10.1f} {r['on']:>10.1f} {r['ratio']:>6.2f}x "
            f"{r['cpu_ratio']:>6.2f}x  {r['acceptance']:>6.2f}  {r['ceiling']:>6.2f}x  {same}"
        )
    return "\n".join(lines)
