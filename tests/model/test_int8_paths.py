"""Every x86 path of the int8-activation matmuls gives the same bits: the host's path, the AVX2
one (``NUMBA_CPU_NAME=haswell``), ymm VNNI (``alderlake``: AVX-VNNI, no AVX-512) and zmm without
VNNI (``skylake-avx512``), each compiled in a subprocess of its own, and a by-hand float32
re-derivation of ggml's reference ``ggml_vec_dot_q4_1_q8_1`` (per block the exact integer dot
product, met by ``d * dx`` in one fused multiply-add, plus the offset term's own accumulator;
Q4_K's sub-blocks as Q4_1 blocks of scale ``d * sc`` and offset ``-(dmin * m)``, Q6_K's two
16-input halves met by their int8 scales in integers first). The cases hold
matrices of rows one after another (23) and grouped side by side (24)."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from pagedattn.kernels.target import has_avx2, has_avx512bw, has_vnni_256
from tests.kernel_cache_dirs import kernel_cache_dir
from tests.model import int8_path_probe
from tests.model.random_blocks import random_blocks

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not has_avx2(), reason="int8 activations need AVX2")


def _round32(value: Fraction) -> np.float32:
    """``value`` rounded once to float32 (nearest, ties to even)."""
    near = np.float32(float(value))
    below = np.nextafter(near, np.float32(-np.inf))
    above = np.nextafter(near, np.float32(np.inf))

    def key(f: np.float32) -> tuple[Fraction, int]:
        return abs(Fraction(float(f)) - value), int(np.array(f).view(np.uint32)) & 1

    return min((below, near, above), key=key)


def _fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    return _round32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def _q8_1(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_1 of one float32 row: per 32 inputs int8 codes, d = max|x| / 127
    and s = d * sum(codes), all float32."""
    blocks = row.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    q = np.rint(blocks * inv[:, None]).astype(np.int64)
    return q, d, (d * q.sum(axis=1).astype(np.float32)).astype(np.float32)


def _weight_blocks(raw: np.ndarray, kind: Q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (N, B, 32) in input order, float32 scales and offsets (N, B) of ggml's block_q4_0
    (f16 d, 16 bytes: input j low nibble, 16 + j high; offset -8 d), block_q4_1 (f16 d, f16 m,
    16 bytes), block_q8_0 (f16 d, 32 int8; no offset), block_q5_0 (f16 d, 32 bits qh: bit j
    input j's fifth bit, 16 bytes as Q4_0's; offset -16 d) or block_q5_1 (f16 d, f16 m, qh,
    16 bytes)."""
    size = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34, Q.Q5_0: 22, Q.Q5_1: 24}[kind]
    blocks = raw.reshape(raw.shape[0], -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == Q.Q8_0:
        return blocks[..., 2:].view(np.int8).astype(np.int64), d, np.zeros_like(d)
    with_min = kind in (Q.Q4_1, Q.Q5_1)
    header = (4 if with_min else 2) + (4 if kind in (Q.Q5_0, Q.Q5_1) else 0)
    packed = blocks[..., header:].astype(np.int64)
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1)
    if kind in (Q.Q5_0, Q.Q5_1):
        qh = blocks[..., header - 4 : header].copy().view(np.uint32)[..., 0].astype(np.int64)
        codes = codes | (((qh[..., None] >> np.arange(32)) & 1) << 4)
    if with_min:
        return codes, d, blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return codes, d, d * np.float32(-8 if kind == Q.Q4_0 else -16)


def _q6_k_blocks(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (N, B, 32) (0-63, stored + 32), int8 scales (N, B, 2) of each 16-input half and
    float32 ``d`` (N, B) per 32-input block of ggml's block_q6_K rows (ql[128], qh[64],
    scales[16], f16 d), read as ``dequantize_row_q6_K`` reads them: for each half of 128
    inputs and l < 32, ql[l] low / ql[l + 32] low / ql[l] high / ql[l + 32] high nibble with
    bits 0-1 / 2-3 / 4-5 / 6-7 of qh[l] above it for inputs l, 32 + l, 64 + l, 96 + l."""
    sb = raw.reshape(raw.shape[0], -1, 210)
    ql, qh = sb[..., :128].astype(np.int64), sb[..., 128:192].astype(np.int64)
    codes = np.empty((*sb.shape[:2], 256), np.int64)
    for n in range(2):
        low, high = ql[..., 64 * n : 64 * n + 64], qh[..., 32 * n : 32 * n + 32]
        for q in range(4):
            nib = (low[..., 32 * (q % 2) : 32 * (q % 2) + 32] >> (4 * (q // 2))) & 15
            codes[..., 128 * n + 32 * q : 128 * n + 32 * q + 32] = nib | (
                ((high >> (2 * q)) & 3) << 4
            )
    scales = sb[..., 192:208].view(np.int8).astype(np.int64)
    d = sb[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    n_rows, n_super = sb.shape[:2]
    return (
        codes.reshape(n_rows, n_super * 8, 32),
        scales.reshape(n_rows, n_super * 8, 2),
        np.repeat(d, 8, axis=1),
    )


def _q4_k_blocks(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (N, B, 32), float32 scales ``d * sc`` and offsets ``-(dmin * m)`` (N, B) per
    32-input sub-block of ggml's block_q4_K rows (f16 d, f16 dmin, scales[12], qs[128]), read
    as ``dequantize_row_q4_K`` reads them: ``get_scale_min_k4``'s 6-bit scale and minimum of
    sub-block j; sub-blocks 2i and 2i + 1 the low and high nibbles of qs[32 i .. 32 i + 31]."""
    sb = raw.reshape(raw.shape[0], -1, 144)
    d = sb[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = sb[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = sb[..., 4:16].astype(np.int64)
    sc, m = np.empty((*sb.shape[:2], 8), np.int64), np.empty((*sb.shape[:2], 8), np.int64)
    for j in range(8):
        if j < 4:
            sc[..., j], m[..., j] = packed[..., j] & 63, packed[..., j + 4] & 63
        else:
            sc[..., j] = (packed[..., j + 4] & 15) | ((packed[..., j - 4] >> 6) << 4)
            m[..., j] = (packed[..., j + 4] >> 4) | ((packed[..., j] >> 6) << 4)
    qs = sb[..., 16:].astype(np.int64).reshape(*sb.shape[:2], 4, 32)
    codes = np.stack([qs & 15, qs >> 4], axis=3).reshape(*sb.shape[:2], 8, 32)
    scales = d[..., None] * sc.astype(np.float32)
    offsets = -(dmin[..., None] * m.astype(np.float32))
    n_rows, n_super = sb.shape[:2]
    return (
        codes.reshape(n_rows, n_super * 8, 32),
        scales.reshape(n_rows, -1),
        offsets.reshape(n_rows, -1),
    )


def test_the_q4_k_reading_is_gguf_s() -> None:
    """The by-hand Q4_K reading gives ``gguf``'s dequantized weights (``(d * sc) * code - dmin
    * m``), so the oracle below reads the format as ggml does."""
    raw = random_blocks(Q.Q4_K, (3, 512), np.random.default_rng(7))
    codes, scales, offsets = _q4_k_blocks(raw)
    weights = scales[..., None] * codes.astype(np.float32) + offsets[..., None]
    want = dequantize(raw, Q.Q4_K).reshape(3, -1)
    assert np.array_equal(weights.reshape(3, -1), want)


def test_the_q6_k_reading_is_gguf_s() -> None:
    """The by-hand Q6_K reading gives ``gguf``'s dequantized weights (``d * scale * (code -
    32)``), so the oracle below reads the format as ggml does."""
    raw = int8_path_probe.random_q6_k(3, 2, np.random.default_rng(7))
    codes, scales, d = _q6_k_blocks(raw)
    by_half = np.repeat(scales, 16, axis=2).reshape(codes.shape)
    weights = (d[..., None] * by_half.astype(np.float32)) * (codes - 32).astype(np.float32)
    want = dequantize(raw, Q.Q6_K).reshape(3, -1)
    assert np.array_equal(weights.reshape(3, -1), want)


def _by_hand_q6_k(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Per 32-input block: ``sc0 * sum_lo + sc1 * sum_hi`` exactly, each half's ``sum((code -
    32) * xq)``, rounded once to float32 and met by ``d * dx`` in one fused multiply-add."""
    codes, scales, d = _q6_k_blocks(raw)
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for t in range(x.shape[0]):
        xq, xd, _ = _q8_1(x[t])
        for n in range(raw.shape[0]):
            acc = np.float32(0)
            for b in range(xq.shape[0]):
                centred = (codes[n, b] - 32) * xq[b]
                total = sum(
                    int(scales[n, b, h]) * int(centred[16 * h : 16 * h + 16].sum())
                    for h in range(2)
                )
                acc = _fma(d[n, b] * xd[b], np.float32(total), acc)
            out[t, n] = acc + np.float32(0)
    return out


def _by_hand(x: np.ndarray, raw: np.ndarray, kind: Q) -> np.ndarray:
    if kind == Q.Q6_K:
        return _by_hand_q6_k(x, raw)
    codes, scales, offsets = _q4_k_blocks(raw) if kind == Q.Q4_K else _weight_blocks(raw, kind)
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for t in range(x.shape[0]):
        xq, xd, xs = _q8_1(x[t])
        for n in range(raw.shape[0]):
            acc = off = np.float32(0)
            for b in range(xq.shape[0]):
                total = np.float32(int((codes[n, b] * xq[b]).sum()))  # exact
                acc = _fma(scales[n, b] * xd[b], total, acc)
                if kind != Q.Q8_0:
                    off = _fma(offsets[n, b], xs[b], off)
            out[t, n] = acc + off
    return out


@pytest.fixture(scope="module")
def host_values() -> dict[str, np.ndarray]:
    return int8_path_probe.collect()


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_host_path_is_ggml_q8_1_dot_by_hand(host_values: dict[str, np.ndarray]) -> None:
    for key, x, raw, kind in int8_path_probe.cases():
        assert _same_bits(host_values[key], _by_hand(x, raw, kind)), key


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@pytest.mark.skipif(
    "NUMBA_CPU_NAME" in os.environ or "NUMBA_CPU_FEATURES" in os.environ,
    reason="compiles for another CPU than the host",
)
def test_the_host_path_follows_its_cpuinfo_flags() -> None:
    from pagedattn.model.int8_ir import int8_path

    flags = _cpuinfo_flags()
    if "avx2" not in flags:
        pytest.skip("no /proc/cpuinfo flags line with AVX2")
    if "avx512bw" in flags:
        want = "vnni-zmm" if "avx512_vnni" in flags else "zmm"
    elif "avx_vnni" in flags or {"avx512_vnni", "avx512vl"} <= flags:
        want = "vnni-ymm"
    else:
        want = "avx2"
    assert int8_path() == want


# CPU name -> (the path it compiles, whether this host can run that CPU's code). Alder Lake's
# VNNI is the VEX-encoded AVX-VNNI, which hosts with only AVX512_VNNI (AMD Zen 4) lack.
CPUS = {
    "haswell": ("avx2", True),
    "alderlake": ("vnni-ymm", has_vnni_256() and "avx_vnni" in _cpuinfo_flags()),
    "skylake-avx512": ("zmm", has_avx512bw()),
}


@pytest.mark.slow  # compiles the int8 kernels for each CPU (when not cached)
@pytest.mark.parametrize("cpu", CPUS)
def test_each_path_has_the_host_bits(
    cpu: str, host_values: dict[str, np.ndarray], tmp_path: Path
) -> None:
    path, runs_here = CPUS[cpu]
    if not runs_here:
        pytest.skip(f"this host cannot run code compiled for {cpu}")
    cache_dir = kernel_cache_dir("int8-paths")
    env = {
        **os.environ,
        "NUMBA_CPU_NAME": cpu,
        "NUMBA_CPU_FEATURES": "",
        "NUMBA_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    target = tmp_path / "values.npz"
    args = [sys.executable, "-m", "tests.model.int8_path_probe", str(target)]
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{cpu}: rc {done.returncode}\n{done.stderr[-3000:]}"
    with np.load(target) as data:
        values = {k: data[k] for k in data.files}
    assert values.pop("path").tobytes().decode() == path
    host = {k: v for k, v in host_values.items() if k != "path"}
    assert host.keys() == values.keys()
    assert [k for k in host if not _same_bits(values[k], host[k])] == []
