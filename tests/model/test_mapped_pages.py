"""A loaded GGUF keeps resident only the file pages the forward reads (model/mapped_pages.py):
the header, parsed into Python objects, and the block matrices the loader copies (into the
kernels' layout, q/k rows in Hugging Face order) are handed back. Residency is read from
/proc/self/pagemap."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from pagedattn.bench.worker import resident_mib
from pagedattn.model.gguf_header import read_gguf
from pagedattn.model.loader import load_model
from pagedattn.model.mapped_pages import file_array, release_pages

PAGE = mmap.PAGESIZE
pytestmark = pytest.mark.skipif(
    resident_mib(np.zeros(1)) is None, reason="needs Linux's /proc/self/pagemap"
)


def _resident_bytes(view: np.ndarray) -> int:
    mib = resident_mib(view)
    assert mib is not None
    return round(mib * (1 << 20))


def _interior(whole: np.ndarray, start: int, size: int) -> np.ndarray:
    """The whole pages of ``whole[start : start + size]``."""
    first = -(-start // PAGE) * PAGE
    return whole[first : (start + size) // PAGE * PAGE]


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


@pytest.mark.model
def test_a_loaded_gguf_holds_none_of_the_file_pages_it_parsed_or_copied() -> None:
    loaded = load_model(None)  # the embedded SmolLM2 (Q4_1, Q8_0), a mapping of its own
    header = read_gguf(loaded.source)  # offsets of the tensors in the file
    norm = loaded.weights["model.layers.0.input_layernorm.weight"]  # F32: a view of the file
    whole = file_array(norm)
    assert whole is not None and whole.size == loaded.source.stat().st_size
    # every block matrix is a copy in the kernels' layout (float32 scales), and the q/k rows
    # are reordered: the file's pages of all of them are handed back
    copied = [t for t in header.tensors if t.type_name in ("Q4_1", "Q8_0")]
    assert len(copied) == 7 * loaded.config.num_layers + 1
    for tensor in copied:
        assert _resident_bytes(_interior(whole, tensor.data_offset, tensor.n_bytes)) == 0
    assert _resident_bytes(_interior(whole, 0, header.data_start)) == 0
    # what the checks would see without the release: what is read from the file is resident
    assert float(np.abs(norm).sum()) > 0
    span = _interior(whole, header.data_start, whole.size - header.data_start)
    assert int(span.sum(dtype=np.int64)) > 0  # reads every page again
    assert _resident_bytes(span) == span.size
