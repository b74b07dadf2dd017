"""Write ``cloze.jsonl``: 40 four-way cloze items cut from ``persuasion.txt`` (Jane Austen,
public domain) in ``../shared/data/corpora``.

Each item is a sentence of 8-30 words ending in a word of 4+ letters followed by a period;
``context`` is the sentence without that word, ``choices`` the word and three other items'
last words (shuffled with a fixed seed), ``answer`` the index of the true word. Deterministic:
running it again writes the same file.

Usage (from the repository root): ``python benchmarks/lm_eval/make_cloze.py``
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[1] / ".." / "shared" / "data" / "corpora" / "persuasion.txt"
NUM_ITEMS = 40


def sentences(text: str) -> list[str]:
    flat = re.sub(r"\s+", " ", text)
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", flat)]


def main() -> None:
    text = CORPUS.resolve().read_text(encoding="utf-8")
    picked: list[tuple[str, str]] = []
    seen: set[str] = set()
    for s in sentences(text):
        m = re.fullmatch(r"([A-Z][^\"'_]*?) ([a-z]{4,})\.", s)
        if not m or not 8 <= len(s.split()) <= 30 or m.group(2) in seen:
            continue
        seen.add(m.group(2))
        picked.append((m.group(1), m.group(2)))
    rng = random.Random(0)
    items = rng.sample(picked, NUM_ITEMS)
    words = [w for _, w in items]
    with (HERE / "cloze.jsonl").open("w", encoding="utf-8") as f:
        for i, (context, word) in enumerate(items):
            others = rng.sample([w for j, w in enumerate(words) if j != i], 3)
            choices = [word, *others]
            rng.shuffle(choices)
            row = {"id": i, "context": context, "choices": choices, "answer": choices.index(word)}
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
