"""What crosses between the ingress and an engine replica: plain data only.

A request is a dict of str / int / float / bool / None / list / dict (its sampling parameters
field by field; a structured-output constraint as its :class:`GuidedSpec`, which the replica
compiles again for its own tokenizer), and each output a dict of the same kinds. Nothing is an
object of this package on the wire, so a replica of another version fails on a field it does
not know rather than on an unpickled class; :func:`decode_request` and :func:`decode_output`
check every field they read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedattn.engine.guided import GuidedLogitsProcessor, GuidedSpec
from pagedattn.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from pagedattn.sampling_params import SamplingParams

_PLAIN_PARAMS = tuple(
    f.name
    for f in dataclasses.fields(SamplingParams)
    if f.name not in ("logit_bias", "logits_processors")
)


class WireError(ValueError):
    """A message that does not have the expected shape."""


def _need(obj: dict[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    value = obj.get(key)
    if not isinstance(value, kinds):
        raise WireError(f"{key}: expected {kinds}, got {type(value).__name__}")
    return value


# ---- requests --------------------------------------------------------------------------------
def encode_request(
    prompt_token_ids: list[int], params: SamplingParams, request_id: str, queued_s: float
) -> dict[str, Any]:
    """The wire form of one request. ``queued_s``: seconds since the ingress received it.

    Raises:
        WireError: a logits processor other than a structured-output one (it cannot be sent).
    """
    guided: list[dict[str, Any]] = []
    for proc in params.logits_processors:
        spec = getattr(proc, "spec", None)
        if not isinstance(proc, GuidedLogitsProcessor) or spec is None:
            raise WireError(f"logits_processors: {proc!r} cannot be sent to a replica")
        guided.append(dataclasses.asdict(spec))
    plain = {name: getattr(params, name) for name in _PLAIN_PARAMS}
    plain["stop"] = list(params.stop)
    plain["stop_token_ids"] = list(params.stop_token_ids)
    bias = None if params.logit_bias is None else [[k, v] for k, v in params.logit_bias.items()]
    return {
        "request_id": request_id,
        "prompt_token_ids": [int(t) for t in prompt_token_ids],
        "params": plain,
        "logit_bias": bias,
        "guided": guided,
        "queued_s": float(queued_s),
    }


def prompt_of(request: dict[str, Any]) -> list[int]:
    """The prompt token ids of a wire request (what the router hashes)."""
    ids = _need(request, "prompt_token_ids", list)
    if not all(isinstance(t, int) for t in ids):
        raise WireError("prompt_token_ids: expected ints")
    return [int(t) for t in ids]


def decode_request(request: dict[str, Any]) -> tuple[list[int], SamplingParams, list[GuidedSpec]]:
    """Prompt ids, sampling parameters (without processors) and the structured-output specs.

    Raises:
        WireError: a missing or mistyped field; ValueError from :class:`SamplingParams`.
    """
    ids = prompt_of(request)
    plain = dict(_need(request, "params", dict))
    unknown = set(plain) - set(_PLAIN_PARAMS)
    if unknown:
        raise WireError(f"params: unknown fields {sorted(unknown)}")
    plain["stop"] = tuple(plain.get("stop", ()))
    plain["stop_token_ids"] = tuple(plain.get("stop_token_ids", ()))
    bias = request.get("logit_bias")
    if bias is not None:
        plain["logit_bias"] = {int(k): float(v) for k, v in bias}
    specs = [GuidedSpec(**g) for g in _need(request, "guided", list)]
    return ids, SamplingParams(**plain), specs


# ---- outputs ---------------------------------------------------------------------------------
def _encode_position(pos: dict[int, Logprob] | None) -> list[list[Any]] | None:
    if pos is None:
        return None
    return [[t, lp.logprob, lp.rank, lp.decoded_token] for t, lp in pos.items()]


def _decode_position(rows: list[list[Any]] | None) -> dict[int, Logprob] | None:
    if rows is None:
        return None
    return {int(t): Logprob(float(lp), rank, text) for t, lp, rank, text in rows}


def encode_output(out: RequestOutput) -> dict[str, Any]:
    """The wire form of one engine output (a delta from ``LLMEngine.step``)."""
    return {
        "request_id": out.request_id,
        "prompt_token_ids": list(out.prompt_token_ids),
        "finished": out.finished,
        "num_cached_tokens": out.num_cached_tokens,
        "error": out.error,
        "metrics": dataclasses.asdict(out.metrics),
        "prompt_logprobs": None
        if out.prompt_logprobs is None
        else [_encode_position(p) for p in out.prompt_logprobs],
        "outputs": [
            {
                "index": c.index,
                "text": c.text,
                "token_ids": list(c.token_ids),
                "cumulative_logprob": c.cumulative_logprob,
                "logprobs": None
                if c.logprobs is None
                else [_encode_position(p) for p in c.logprobs],
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in out.outputs
        ],
    }


def decode_output(data: dict[str, Any]) -> RequestOutput:
    """The :class:`RequestOutput` of :func:`encode_output`'s dict. Raises WireError."""
    try:
        outputs = [
            CompletionOutput(
                index=int(c["index"]),
                text=str(c["text"]),
                token_ids=[int(t) for t in c["token_ids"]],
                cumulative_logprob=c["cumulative_logprob"],
                logprobs=None
                if c["logprobs"] is None
                else [_decode_position(p) or {} for p in c["logprobs"]],
                finish_reason=c["finish_reason"],
                stop_reason=c["stop_reason"],
            )
            for c in _need(data, "outputs", list)
        ]
        prompt_logprobs = data["prompt_logprobs"]
        return RequestOutput(
            request_id=str(data["request_id"]),
            prompt=None,
            prompt_token_ids=[int(t) for t in data["prompt_token_ids"]],
            outputs=outputs,
            finished=bool(data["finished"]),
            metrics=RequestMetrics(**_need(data, "metrics", dict)),
            num_cached_tokens=int(data["num_cached_tokens"]),
            prompt_logprobs=None
            if prompt_logprobs is None
            else [_decode_position(p) for p in prompt_logprobs],
            error=data["error"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"engine output: {type(exc).__name__}: {exc}") from exc
