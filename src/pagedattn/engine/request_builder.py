"""RequestBuilder: a prompt and its sampling parameters become a request's sequence.

It checks the prompt's token ids against the vocabulary, draws the request's seed, and gives
each sequence its generator, its incremental detokenizer and the stop strings that are
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
from pagedattn.engine.step_report import PhaseClock, TimedTextStream
from pagedattn.sampling_params import SamplingParams


class RequestBuilder:
    """Builds the :class:`Sequence` of each request one engine queues.

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

    def draw_seed(self) -> int:
        """A seed for a request without one (from the engine's generator)."""
        return int(self._rng.integers(2**63))

    def build(
        self,
        prompt: str | SequenceABC[int],
        params: SamplingParams | None,
        request_id: str | None,
        arrival_time: float | None,
    ) -> Sequence:
        """The sequence of one request of one completion, as :meth:`LLMEngine.add_request
        <pagedattn.engine.llm_engine.LLMEngine.add_request>` documents it.

        Raises:
            ValueError: a bad prompt (see :meth:`encode`), or a ``logit_bias`` /
                ``stop_token_ids`` id outside the tokenizer's vocabulary.
        """
        params = SamplingParams() if params is None else params
        request_id = uuid.uuid4().hex if request_id is None else request_id
        return self.build_many(prompt, [params], [request_id], arrival_time)[0]

    def build_many(
        self,
        prompt: str | SequenceABC[int],
        params: SequenceABC[SamplingParams],
        request_ids: SequenceABC[str],
        arrival_time: float | None,
        lead_from: int | None = None,
    ) -> list[Sequence]:
        """One sequence per ``(params[i], request_ids[i])`` on one prompt (encoded once), their
        metrics shared: the child requests of a parent. Sequence ``i`` draws from
        ``make_generator(params[i].seed)`` (a seed drawn here when None). ``lead_from``: with a
        prompt of at least that many tokens every sequence but the first waits for the first's
        prompt (``prefix_lead``); None = none waits.

        Raises:
            ValueError: as :meth:`build`.
        """
        ids = self.encode(prompt)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        lead = lead_from is not None and len(ids) >= lead_from
        seqs: list[Sequence] = []
        for p, request_id in zip(params, request_ids, strict=True):
            p.check_vocab(self.vocab_size)
            seed = p.seed if p.seed is not None else self.draw_seed()
            special_stops = {self._special_ids[s]: s for s in p.stop if s in self._special_ids}
            text_stream = None
            if self.tokenizer is not None:
                from pagedattn.model.detokenizer import IncrementalDetokenizer

                text_stream = TimedTextStream(
                    IncrementalDetokenizer(
                        self.tokenizer,
                        skip_special_tokens=p.skip_special_tokens,
                        prompt_token_ids=ids,
                    ),
                    self.detokenize_clock,
                )
            seqs.append(
                Sequence(
                    seq_id=next(self._seq_ids),
                    request_id=request_id,
                    prompt_token_ids=ids,
                    params=p,
                    generator=make_generator(seed),
                    arrival_time=arrival,
                    text_stream=text_stream,
                    max_model_len=self.max_model_len,
                    prompt=prompt if isinstance(prompt, str) else None,
                    decode_token=self._decode_token,
                    special_stops=special_stops,
                    metrics=seqs[0].metrics if seqs else None,
                    prefix_lead=seqs[0] if lead and seqs else None,
                )
            )
        return seqs

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
