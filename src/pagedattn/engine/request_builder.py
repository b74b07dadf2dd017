"""RequestBuilder: a prompt and its sampling parameters become a request's sequences.

It checks the prompt's token ids against the vocabulary, draws the request's seed, and gives
each completion its generator, its incremental detokenizer and the stop strings that are
special tokens (vLLM's input processor does this part of ``add_request``).
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from collections.abc import Callable
from collections.abc import Sequence as SequenceABC
from typing import Any

import numpy as np

from pagedattn.engine.prompt_ids import encode_prompt
from pagedattn.engine.sampler import make_generator
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.sequence_group import SequenceGroup
from pagedattn.engine.step_report import PhaseClock, TimedTextStream
from pagedattn.sampling_params import SamplingParams


class RequestBuilder:
    """Builds the :class:`SequenceGroup` of each request one engine queues.

    Args:
        tokenizer: the engine's tokenizer, or None (token-id prompts, empty output text).
        vocab_size: ids must be in ``[0, vocab_size)``.
        max_model_len: the most tokens a sequence may hold (None = unbounded).
        seed: seed of the generator that draws the seed of a request without one.

    Attributes:
        detokenize_clock: the seconds every request's detokenizer has spent (step reports).
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, max_model_len: int | None, seed: int
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._decode_token: Callable[[int], str] | None = (
            None if tokenizer is None else functools.lru_cache(maxsize=65536)(self._decode_one)
        )
        self._special_ids = self._special_token_ids()
        self._rng = np.random.default_rng(seed)
        self._seq_ids = itertools.count()
        self.detokenize_clock = PhaseClock()

    def encode(self, prompt: str | SequenceABC[int]) -> list[int]:
        """Prompt token ids (text goes through the tokenizer): see :func:`encode_prompt`."""
        return encode_prompt(self.tokenizer, self.vocab_size, prompt)

    def build(
        self,
        prompt: str | SequenceABC[int],
        params: SamplingParams | None,
        request_id: str | None,
        arrival_time: float | None,
    ) -> SequenceGroup:
        """The sequences of one request, as :meth:`LLMEngine.add_request
        <pagedattn.engine.llm_engine.LLMEngine.add_request>` documents them.

        Raises:
            ValueError: a bad prompt (see :meth:`encode`), or a ``logit_bias`` /
                ``stop_token_ids`` id outside the tokenizer's vocabulary.
        """
        params = SamplingParams() if params is None else params
        request_id = uuid.uuid4().hex if request_id is None else request_id
        ids = self.encode(prompt)
        params.check_vocab(self.vocab_size)
        seed = params.seed if params.seed is not None else int(self._rng.integers(2**63))
        special_stops = {self._special_ids[s]: s for s in params.stop if s in self._special_ids}
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs: list[Sequence] = []
        for i in range(params.num_completions):
            text_stream = None
            if self.tokenizer is not None:
                from pagedattn.model.detokenizer import IncrementalDetokenizer

                text_stream = TimedTextStream(
                    IncrementalDetokenizer(
                        self.tokenizer,
                        skip_special_tokens=params.skip_special_tokens,
                        prompt_token_ids=ids,
                    ),
                    self.detokenize_clock,
                )
            seqs.append(
                Sequence(
                    seq_id=next(self._seq_ids),
                    request_id=request_id,
                    prompt_token_ids=ids,
                    params=params,
                    generator=make_generator(seed + i),
                    arrival_time=arrival,
                    text_stream=text_stream,
                    max_model_len=self.max_model_len,
                    prompt=prompt if isinstance(prompt, str) else None,
                    index=i,
                    decode_token=self._decode_token,
                    special_stops=special_stops,
                    metrics=seqs[0].metrics if seqs else None,
                )
            )
        return SequenceGroup(seqs)

    def _decode_one(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    def _special_token_ids(self) -> dict[str, int]:
        """Special-token text -> id (a stop string equal to one stops on that token)."""
        backend = getattr(self.tokenizer, "backend", None)
        if backend is None:
            return {}
        return {
            tok.content: int(i)
            for i, tok in backend.get_added_tokens_decoder().items()
            if tok.special
        }
