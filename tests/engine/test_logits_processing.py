"""min_tokens, logit_bias, penalties and min_p against HF transformers' logits processors (or the
OpenAI definition written out here), and their validation."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.engine.penalties import apply_logits_processing
from pagedattn.engine.sampler import make_generator, mask_padded_vocab, sample, sampling_probs
from pagedattn.sampling_params import SamplingParams

torch = pytest.importorskip("torch")
generation = pytest.importorskip("transformers.generation.logits_process")

VOCAB = 64


def _case(seed: int) -> tuple[np.ndarray, list[int], list[int]]:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
    prompt = rng.integers(0, VOCAB, 12).tolist()
    output = rng.integers(0, VOCAB, 9).tolist()
    return logits, prompt, output


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_hf(penalty: float) -> None:
    for seed in range(5):
        logits, prompt, output = _case(seed)
        ours = apply_logits_processing(
            logits, SamplingParams(repetition_penalty=penalty), prompt, output
        )
        proc = generation.RepetitionPenaltyLogitsProcessor(penalty=penalty)
        ref = proc(torch.tensor([prompt + output]), torch.tensor(logits[None]))[0].numpy()
        np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_frequency_and_presence_follow_the_openai_definition() -> None:
    for seed in range(5):
        logits, prompt, output = _case(seed)
        params = SamplingParams(frequency_penalty=0.7, presence_penalty=-1.1)
        ours = apply_logits_processing(logits, params, prompt, output)
        ref = logits.astype(np.float64).copy()
        for j in range(
            VOCAB
        ):  # mu[j] -> mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
            c = output.count(j)  # generated tokens only: the prompt does not count
            ref[j] -= c * 0.7 + (1.0 if c > 0 else 0.0) * -1.1
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


def test_min_tokens_equals_hf_min_new_tokens() -> None:
    logits, prompt, _ = _case(0)
    params = SamplingParams(min_tokens=3, max_tokens=5, stop_token_ids=[7])
    proc = generation.MinNewTokensLengthLogitsProcessor(
        prompt_length_to_skip=len(prompt), min_new_tokens=3, eos_token_id=[2, 7]
    )
    for generated in ([], [5], [5, 6], [5, 6, 8]):
        ours = apply_logits_processing(logits, params, prompt, generated, eos_token_ids=[2])
        ids = torch.tensor([prompt + generated])
        ref = proc(ids, torch.tensor(logits[None]))[0].numpy()
        np.testing.assert_array_equal(ours, ref)
    # ignore_eos: end-of-sequence is not masked, stop_token_ids still are
    p2 = SamplingParams(min_tokens=3, max_tokens=5, stop_token_ids=[7], ignore_eos=True)
    out = apply_logits_processing(logits, p2, prompt, [], eos_token_ids=[2])
    assert out[2] == logits[2] and out[7] == -np.inf


def test_logit_bias_adds_and_minus_100_bans() -> None:
    logits, prompt, output = _case(1)
    top = int(np.argmax(logits))
    params = SamplingParams(temperature=0, logit_bias={top: -100, 3: 2.5, 4: 100})
    ours = apply_logits_processing(logits, params, prompt, output)
    assert ours[top] == -np.inf
    assert ours[3] == pytest.approx(logits[3] + 2.5) and ours[4] == pytest.approx(logits[4] + 100)
    # Sampling never picks a banned token, even at high temperature.
    ban = SamplingParams(temperature=5.0, logit_bias={top: -100})
    rows = np.broadcast_to(logits, (200, VOCAB)).copy()
    got = sample(rows, [ban] * 200, [make_generator(i) for i in range(200)], [output] * 200)
    assert top not in got.tolist()


@pytest.mark.parametrize(("min_p", "temperature"), [(0.05, 1.0), (0.2, 0.7), (0.5, 1.5)])
def test_min_p_support_equals_hf(min_p: float, temperature: float) -> None:
    for seed in range(5):
        logits, _, _ = _case(seed)
        probs = sampling_probs(logits, SamplingParams(temperature=temperature, min_p=min_p))
        warper = generation.MinPLogitsWarper(min_p=min_p)
        scaled = torch.tensor(logits[None].astype(np.float64) / temperature)
        ref = torch.softmax(warper(None, scaled), -1)[0].numpy()
        np.testing.assert_allclose(probs, ref, atol=1e-12)


def test_padded_vocab_is_masked() -> None:
    logits = np.zeros((2, 10), np.float32)
    logits[:, 8] = 50.0
    mask_padded_vocab(logits, 8)
    assert np.isneginf(logits[:, 8:]).all() and (logits[:, :8] == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ],
)
def test_new_fields_are_validated(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_vocab_checks_name_the_field() -> None:
    SamplingParams(logit_bias={"5": 1.0}, stop_token_ids=[9]).check_vocab(10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={10: 1.0}).check_vocab(10)
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[10]).check_vocab(10)
