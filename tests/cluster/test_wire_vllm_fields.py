"""vLLM's ``allowed_token_ids`` / ``bad_words`` and a raised ``max_logprobs`` cross the wire to a
replica as plain data (JSON), and mean the same there."""

from __future__ import annotations

import json

import numpy as np

from pagedattn.cluster.wire import decode_request, encode_request
from pagedattn.engine.penalties import apply_logits_processing
from pagedattn.sampling_params import SamplingParams


def test_the_fields_round_trip_through_json() -> None:
    params = SamplingParams(
        seed=2**64 - 1,
        logprobs=100,
        max_logprobs=300,
        allowed_token_ids=(3, 5, 7),
        bad_words_token_ids=((5,), (1, 7)),
    )
    wire = json.loads(json.dumps(encode_request([1, 2], params, "r", 0.0)))
    ids, back, specs = decode_request(wire)
    assert ids == [1, 2] and specs == [] and back == params
    row = np.arange(10, dtype=np.float32)
    # after ... 1 the sequence (1, 7) bans 7; 5 is banned everywhere; only 3, 5, 7 allowed
    z = apply_logits_processing(row, back, [1, 2], [4, 1])
    assert np.isfinite(z).nonzero()[0].tolist() == [3]
    z = apply_logits_processing(row, back, [1, 2], [1, 4])
    assert np.isfinite(z).nonzero()[0].tolist() == [3, 7]
