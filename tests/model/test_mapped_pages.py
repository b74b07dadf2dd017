"""A loaded GGUF keeps resident only the file pages the forward reads (model/mapped_pages.py):
the header, parsed into Python objects, and every tensor the loader copies (the block matrices
into the kernels' layout, q/k rows in Hugging Face order, the float tensors) are handed back.
Residency is read from /proc/self/pagemap and /proc/self/smaps."""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagedattn.bench.worker import resident_mib
from pagedattn.model.mapped_pages import file_array, release_pages

PAGE = mmap.PAGESIZE
pytestmark = pytest.mark.skipif(
    resident_mib(np.zeros(1)) is None, reason="needs Linux's /proc/self/pagemap"
)


def _resident_bytes(view: np.ndarray) -> int:
    mib = resident_mib(view)
    assert mib is not None
    return round(mib * (1 << 20))


def test_released_pages_leave_the_process_and_the_data_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    data = np.arange(16 * PAGE, dtype=np.uint32).astype(np.uint8)
    path.write_bytes(data.tobytes())
    with path.open("rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    whole = np.frombuffer(mapping, np.uint8)
    assert file_array(whole[PAGE:].reshape(-1, 64)[2:]) is whole
    assert int(whole.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # all read
    assert _resident_bytes(whole) == 16 * PAGE
    # from 10 bytes into page 1 to the end of page 4: pages 2, 3 and 4 lie wholly inside
    assert release_pages(whole[PAGE + 10 : 5 * PAGE]) == 3 * PAGE
    assert _resident_bytes(whole) == 13 * PAGE
    assert _resident_bytes(whole[2 * PAGE : 5 * PAGE]) == 0
    np.testing.assert_array_equal(whole, data)  # read again from the file
    assert release_pages(np.zeros(4 * PAGE, np.uint8)) == 0  # not a mapping: nothing
    assert release_pages(whole[PAGE + 1 : 2 * PAGE + 1]) == 0  # no whole page inside


# Run alone in a fresh process: a test process may map the same file through other readers
# (transformers' GGUF reader, another test's model), whose pages smaps counts too.
_CHILD = """
import json, mmap, sys
from pathlib import Path
import numpy as np
from pagedattn.engine.llm import LLM
from pagedattn.model.registry import embedded_model_path
from pagedattn.sampling_params import SamplingParams

def resident(path):
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total

path = embedded_model_path()
llm = LLM(path, speculative="none")
after_load = resident(path)
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4))
after_generate = resident(path)
with path.open("rb") as f:
    mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
read = np.frombuffer(mapping, np.uint8)[: 64 * mmap.PAGESIZE]
assert int(read.sum(dtype=np.int64)) > 0
print(json.dumps({"after_load": after_load, "after_generate": after_generate,
                  "after_read": resident(path), "tokens": len(out[0].outputs[0].token_ids)}))
"""


@pytest.mark.model
def test_a_loaded_gguf_holds_none_of_the_file_pages_it_parsed_or_copied() -> None:
    # the embedded SmolLM2 (Q4_1, Q8_0, F32 norms): every tensor becomes the process's own
    # copy (the block matrices in the kernels' layout, q/k rows reordered), so no page of the
    # file stays mapped, nor comes back when the forward reads them
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["tokens"] == 4
    # at most the page the header shares with the data and the file's last, partial page
    assert got["after_load"] <= 2 * PAGE
    assert got["after_generate"] == got["after_load"]
    # what the check sees of a mapping that is read: every page read is resident
    assert got["after_read"] >= got["after_load"] + 64 * PAGE
