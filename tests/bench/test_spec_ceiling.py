"""The n-gram ceiling of `pagedattn bench spec`: steps of a greedy output replayed through the
lookup with free verify rows and perfect draft lengths (counts worked out by hand)."""

from __future__ import annotations

from pagedattn.bench.spec import ngram_ceiling


def test_a_copied_run_takes_one_step() -> None:
    # Steps at output index 1 (no match), 2 (no match), 3: (1, 2) matches the prompt's start,
    # drafts 3, 4, 5 (at most the 3 tokens left), all kept.
    assert ngram_ceiling([1, 2, 3, 4, 5], [9, 1, 2, 3, 4, 5, 7], 2, 4, 8) == (6, 3)


def test_a_draft_counts_only_up_to_where_the_output_leaves_it() -> None:
    # At index 3 the drafts 3, 4 meet 3, 8: one kept; index 5 is the last token, no draft.
    assert ngram_ceiling([1, 2, 3, 4, 5], [9, 1, 2, 3, 8, 5], 2, 4, 8) == (5, 4)
    # One draft a step: index 3 keeps 3 (-> 5), index 5 keeps 5 after (3, 4) (-> 7).
    assert ngram_ceiling([1, 2, 3, 4, 5], [9, 1, 2, 3, 4, 5, 7], 2, 4, 1) == (6, 4)
    assert ngram_ceiling([1, 2], [7], 2, 4, 8) == (0, 0)
