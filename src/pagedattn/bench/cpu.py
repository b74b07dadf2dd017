"""The CPU's vector / matrix instruction sets, as the bench reports them (Linux
``/proc/cpuinfo`` flags; other systems: "unknown")."""

from __future__ import annotations

from pathlib import Path

# flag in /proc/cpuinfo -> the name printed
FEATURES = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "amx_tile": "AMX",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
}


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Names of the :data:`FEATURES` the first CPU lists, in table order; ``["unknown"]``
    when ``cpuinfo`` cannot be read or has no ``flags`` line."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ["unknown"]
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return [name for flag, name in FEATURES.items() if flag in flags]
    return ["unknown"]


def cpu_line() -> str:
    """One line for a bench header: ``CPU features: AVX2 FMA AVX-512 ...``."""
    found = cpu_features()
    return "CPU features: " + (
        " ".join(found) if found else "none of " + ", ".join(FEATURES.values())
    )
