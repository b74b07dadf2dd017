"""Draft-free speculative decoding that never changes the output.

:mod:`~pagedattn.engine.spec.ngram` proposes drafts from the request's own prompt and output,
:mod:`~pagedattn.engine.spec.drafter` plans which sequences draft and reserves their slots,
:mod:`~pagedattn.engine.spec.verify` lays the drafts out as decode rows of the step, and
:mod:`~pagedattn.engine.spec.acceptance` keeps what the request's own sampler confirms. Every
kept token, and its logprobs, is bitwise what plain decoding produces.
"""
