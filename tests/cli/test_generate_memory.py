"""What `pagedattn generate` costs in memory, in a process of its own as a user runs it: a short
prompt makes resident only the KV pages it wrote (not the 256 MiB pool it reserves), and the
process imports neither torch / transformers nor SciPy's linear algebra (Numba's BLAS probe)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagedattn.bench.worker import resident_mib

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch", "transformers", "scipy.linalg", "pandas")

# Runs the command line's entry point; records, when the engine closes, the pool's resident
# bytes (pagemap) and the prompt's length, and at exit which heavy modules were imported.
RUN = """
import atexit, json, sys
from pagedattn.bench.worker import resident_mib
from pagedattn.engine import llm_engine

seen = {}
target = sys.argv[1]
close = llm_engine.LLMEngine.close

def recording_close(self):
    pool = self.page_pool
    seen.update(
        resident_bytes=round(resident_mib(pool.kv) * (1 << 20)),
        pool_bytes=int(pool.kv.nbytes),
        shape=list(pool.kv.shape),
        itemsize=int(pool.kv.itemsize),
        prompt_tokens=len(self.tokenizer.encode_chat([{"role": "user", "content": "Hi"}])),
    )
    close(self)

llm_engine.LLMEngine.close = recording_close

def report():
    seen["imported"] = sorted(m for m in HEAVY if m in sys.modules)
    with open(target, "w") as f:
        json.dump(seen, f)

atexit.register(report)
from pagedattn.cli import main
sys.argv = ["pagedattn", "generate", "Hi", "--max-tokens", "8"]
main()
"""

pytestmark = pytest.mark.skipif(
    resident_mib(np.zeros(1)) is None, reason="needs Linux's /proc/self/pagemap"
)


@pytest.mark.model
def test_generate_hi_costs_its_pages_not_the_pool_and_imports_no_torch(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONPATH": str(SRC), "NUMBA_NUM_THREADS": "1"}
    code = f"HEAVY = {HEAVY!r}\n" + RUN
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # an answer was printed
    seen = json.loads(out.read_text())
    assert seen["imported"] == []
    layers, kv, _, heads, page_size, head_dim = seen["shape"]
    assert (layers, kv, heads, page_size, head_dim) == (30, 2, 3, 16, 64)  # SmolLM2-135M
    # a page of the pool: K and V of every layer, each a (heads, page_size, head_dim) tile of
    # whole 4 KiB memory pages (3 * 16 * 64 * 4 bytes = 12 KiB)
    page_bytes = layers * kv * heads * page_size * head_dim * seen["itemsize"]
    assert seen["pool_bytes"] >= 256 * (1 << 20) - page_bytes  # the default budget, reserved
    written_least = seen["prompt_tokens"]  # the prompt, then up to 7 fed-back tokens
    least, most = (math.ceil(n / page_size) for n in (written_least, written_least + 7))
    assert least * page_bytes <= seen["resident_bytes"] <= most * page_bytes
