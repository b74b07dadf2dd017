"""Stop strings never leak, also when they span several streamed deltas."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedattn.engine.outputs import FINISH_LENGTH, FINISH_STOP
from pagedattn.engine.sampler import make_generator
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.stop import StopStringTracker
from pagedattn.sampling_params import SamplingParams


def _stream(deltas: list[str], stop: list[str]) -> tuple[list[str], bool, str]:
    tracker = StopStringTracker(stop)
    emitted = []
    stopped = False
    for d in deltas:
        out, stopped = tracker.add(d)
        emitted.append(out)
        if stopped:
            break
    if not stopped:
        emitted.append(tracker.flush())
    return emitted, stopped, tracker.text


def test_stop_string_spanning_deltas_is_cut_and_never_emitted() -> None:
    emitted, stopped, text = _stream(["Hello wo", "rld. ", "EN", "D", " more"], ["END"])
    assert stopped
    assert "".join(emitted) == "Hello world. " == text
    assert emitted == ["Hello wo", "rld. ", "", ""]  # "EN" held back, then cut


def test_held_back_text_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    emitted, stopped, _ = _stream(["a E", "N", "x", "b"], ["END"])
    assert not stopped
    assert emitted == ["a ", "", "ENx", "b", ""]


def test_earliest_of_several_stop_strings_wins() -> None:
    _, stopped, text = _stream(["xx", "STOP then END"], ["END", "STOP"])
    assert stopped and text == "xx"


@given(
    st.text(alphabet="abE", max_size=30),
    st.lists(st.integers(1, 4), min_size=1, max_size=30),
)
def test_streamed_text_equals_the_cut_full_text(full: str, cuts: list[int]) -> None:
    stop = ["EE", "bab"]
    deltas, i, k = [], 0, 0
    while i < len(full):
        c = cuts[k % len(cuts)]
        deltas.append(full[i : i + c])
        i, k = i + c, k + 1
    emitted, stopped, _ = _stream(deltas, stop)
    first = min((j for s in stop if (j := full.find(s)) >= 0), default=-1)
    expected = full if first < 0 else full[:first]
    assert "".join(emitted) == expected
    assert stopped == (first >= 0)
    # No emitted prefix ever contains the start of a stop string that later completes.
    so_far = ""
    for e in emitted:
        so_far += e
        assert all(s not in so_far for s in stop)


class _Chars:
    """A text stream where token id t is the character chr(t)."""

    def add_token(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


def _seq(params: SamplingParams) -> Sequence:
    return Sequence(0, "r", [1, 2], params, make_generator(0), 0.0, text_stream=_Chars())


def test_sequence_max_tokens_exact_and_eos_handling() -> None:
    seq = _seq(SamplingParams(max_tokens=3))
    for t in (ord("a"), ord("b"), ord("c")):
        assert not seq.is_finished
        seq.append_token(t, eos_token_ids={0}, now=1.0)
    assert seq.finish_reason == FINISH_LENGTH and seq.num_generated_tokens == 3
    assert seq.take_output().outputs[0].text == "abc"

    seq = _seq(SamplingParams(max_tokens=5))
    seq.append_token(ord("a"), {0}, 1.0)
    seq.append_token(0, {0}, 2.0)
    out = seq.take_output().outputs[0]
    assert out.finish_reason == FINISH_STOP and out.token_ids == [ord("a"), 0] and out.text == "a"

    seq = _seq(SamplingParams(max_tokens=3, ignore_eos=True))
    for _ in range(3):
        seq.append_token(0, {0}, 1.0)
    assert seq.finish_reason == FINISH_LENGTH and seq.num_generated_tokens == 3


def test_sequence_stop_string_across_tokens_and_flush_on_length() -> None:
    seq = _seq(SamplingParams(max_tokens=10, stop=["XY"]))
    texts = []
    for ch in "abXY":
        seq.append_token(ord(ch), set(), 1.0)
        texts.append(seq.take_output().outputs[0].text)
    assert texts == ["a", "b", "", ""] and seq.finish_reason == FINISH_STOP
    assert seq.text == "ab"

    seq = _seq(SamplingParams(max_tokens=2, stop=["XY"]))
    seq.append_token(ord("a"), set(), 1.0)
    seq.append_token(ord("X"), set(), 1.0)
    assert seq.finish_reason == FINISH_LENGTH
    assert seq.take_output().outputs[0].text == "aX"  # held-back "X" released at the end
