"""The perplexity lab per layer group on a tiny Gemma 3 (5 sliding-window layers of window 8,
1 full-attention layer, pages of 4 tokens): every policy's NLL equals transformers' forward
whose masks are, per layer type, the keys that policy leaves visible (worked out by hand here),
the sliding layers hold only their window's pages, and the fast path equals token by token."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pagedattn.eval.perplexity import PerplexityResult, run_perplexity
from pagedattn.eval.policies import make_policy
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model

PS = 4
N = 41  # tokens: 40 are fed, every one scored
WINDOW = 8  # the tiny Gemma's sliding window (tests.model.families.WINDOW)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, LlamaModel]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.model.families import WINDOW as FAMILY_WINDOW
    from tests.model.families import gguf_with_oracle

    assert FAMILY_WINDOW == WINDOW
    hf, path = gguf_with_oracle("gemma3", tmp_path_factory.mktemp("gemma3-eval"))
    return hf, LlamaModel.from_loaded(load_model(path))


def _ids(model: LlamaModel) -> np.ndarray:
    return np.random.default_rng(7).integers(3, model.config.vocab_size, size=N)


def _run(model: LlamaModel, name: str, budget: int | None, **kw: Any) -> PerplexityResult:
    policy = make_policy(name, page_size=PS, budget=budget, seed=3)
    return run_perplexity(model, _ids(model), policy, page_size=PS, budget=budget, **kw)


def _hf_nll(hf: Any, ids: np.ndarray, masks: dict[str, np.ndarray] | None) -> np.ndarray:
    import torch

    n = ids.size - 1
    kwargs: dict[str, Any] = {}
    if masks is not None:
        floor = torch.finfo(torch.float32).min
        kwargs["attention_mask"] = {
            kind: torch.where(torch.from_numpy(m), 0.0, floor)[None, None]
            for kind, m in masks.items()
        }
    with torch.no_grad():
        logits = hf(torch.tensor(ids[None, :n]), **kwargs).logits[0].double()
    nll = torch.logsumexp(logits, -1) - logits[torch.arange(n), torch.tensor(ids[1:])]
    out: np.ndarray = nll.numpy()
    return out


def _mask(window: int, sinks: int = 0) -> np.ndarray:
    """(n, n): query i sees key j <= i within the last ``window`` tokens or among the sinks."""
    i, j = np.indices((N - 1, N - 1))
    out: np.ndarray = (j <= i) & ((j > i - window) | (j < sinks))
    return out


@pytest.mark.hf
@pytest.mark.parametrize("fast", [True, False])
def test_full_equals_transformers_and_sliding_layers_keep_their_window(
    gemma: tuple[Any, LlamaModel], fast: bool
) -> None:
    hf, model = gemma
    ours = _run(model, "full", None, fast=fast)
    np.testing.assert_allclose(ours.nll, _hf_nll(hf, _ids(model), None), rtol=0, atol=1e-4)
    groups = {g["name"]: g for g in ours.record()["kv_groups"]}
    assert groups["full"]["num_layers"] == 1 and groups["sliding_8"]["num_layers"] == 5
    assert groups["full"]["peak_pages"] == (N - 1) // PS  # every page of the 40 tokens
    if not fast:  # 8 keys p-7..p span at most 3 pages of 4, and the next token opens none early
        assert groups["sliding_8"]["peak_pages"] == 3
    per_layer_page = ours.page_bytes // model.config.num_layers
    assert groups["sliding_8"]["peak_bytes"] == groups["sliding_8"]["peak_pages"] * 5 * (
        per_layer_page
    )


@pytest.mark.hf
@pytest.mark.parametrize(
    ("name", "budget", "full_window", "sinks"),
    [
        ("window", 24, 21, 0),  # W = (6 - 1) * 4 + 1 > 8: the sliding layers keep their own 8
        ("window", 8, 5, 0),  # W = (2 - 1) * 4 + 1 < 8: the sliding layers see 5 too
        ("sinks", 24, 17, 4),  # 4 sinks on 1 page, W = (6 - 1 - 1) * 4 + 1
        ("sinks", 12, 5, 4),  # W = (3 - 1 - 1) * 4 + 1 < 8
    ],
)
def test_window_and_sinks_act_on_each_group_as_worked_out_by_hand(
    gemma: tuple[Any, LlamaModel], name: str, budget: int, full_window: int, sinks: int
) -> None:
    hf, model = gemma
    masks = {
        "full_attention": _mask(full_window, sinks),
        "sliding_attention": _mask(min(full_window, WINDOW), sinks),
    }
    want = _hf_nll(hf, _ids(model), masks)
    fast = _run(model, name, budget, fast=True)
    slow = _run(model, name, budget, fast=False)
    np.testing.assert_allclose(slow.nll, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(fast.nll, slow.nll, rtol=0, atol=1e-4)
    assert slow.peak_pages * PS <= budget
    sliding = next(g for g in slow.record()["kv_groups"] if g["name"] == "sliding_8")
    assert sliding["window"] == min(full_window, WINDOW)


@pytest.mark.hf
def test_random_acts_on_the_full_layers_only(gemma: tuple[Any, LlamaModel]) -> None:
    hf, model = gemma
    ours = _run(model, "random", 16, fast=False, trace=True)
    assert ours.resident_log is not None
    i, j = np.indices((N - 1, N - 1))
    full = np.zeros((N - 1, N - 1), bool)
    for start, _, pages in ours.resident_log:
        full[start] = (j[start] <= start) & np.isin(j[start] // PS, pages)
    assert not full.all(where=j <= i)  # the policy dropped keys the full layer could see
    want = _hf_nll(hf, _ids(model), {"full_attention": full, "sliding_attention": _mask(WINDOW)})
    np.testing.assert_allclose(ours.nll, want, rtol=0, atol=1e-4)
    fast = _run(model, "random", 16, fast=True)
    np.testing.assert_allclose(fast.nll, ours.nll, rtol=0, atol=1e-4)


def test_a_window_past_the_text_equals_full(gemma: tuple[Any, LlamaModel]) -> None:
    _, model = gemma
    full = _run(model, "full", None, fast=False)
    wide = _run(model, "window", 64, fast=False)  # W = 61 >= the 40 tokens fed
    np.testing.assert_allclose(wide.nll, full.nll, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("name", "mode", "named"), [("h2o", "absolute", "h2o")])
def test_attention_score_policy_is_refused_naming_it(
    gemma: tuple[Any, LlamaModel], name: str, mode: str, named: str
) -> None:
    _, model = gemma
    policy = make_policy(name, page_size=PS, budget=16, position_mode=mode)
    with pytest.raises(ValueError, match=f"policy: '{named}'.*sliding windows"):
        run_perplexity(model, _ids(model), policy, page_size=PS)


def test_shifted_positions_are_refused(gemma: tuple[Any, LlamaModel]) -> None:
    _, model = gemma
    policy = make_policy("sinks", page_size=PS, budget=16, position_mode="shifted")
    with pytest.raises(ValueError, match="position_mode: 'shifted'"):
        run_perplexity(model, _ids(model), policy, page_size=PS)
