"""ModelConfig: the model's shapes and numerics, and the activation dtypes."""

from __future__ import annotations

from dataclasses import dataclass

# How 4-bit projections meet their inputs (pagedattn.model.quantized.qmatmul): float32 is exact,
# int8 (opt-in, not exact) quantizes them per 32-input block as llama.cpp does.
ACTIVATIONS = ("float32", "int8")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-architecture decoder.

    ``rope_freq_factors``: None (plain RoPE), or one positive divisor per rotary pair
    (head_dim // 2 floats) applied to the frequencies ``rope_theta^(-2i/head_dim)``: Llama-3.1
    scaling (GGUF ``rope_freqs.weight``, HF ``rope_scaling: {rope_type: llama3}``).
    ``rope_scaling`` names where they came from ("" for none, "llama3").

    Raises:
        ValueError: a non-positive size, num_heads not a multiple of num_kv_heads, or
            rope_freq_factors of the wrong length or not all positive.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    architecture: str = "llama"
    name: str = ""
    rope_scaling: str = ""
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        factors = self.rope_freq_factors
        if factors is not None and (
            len(factors) != self.head_dim // 2 or not all(f > 0 for f in factors)
        ):
            raise ValueError(
                f"ModelConfig.rope_freq_factors: expected {self.head_dim // 2} positive values, "
                f"got {len(factors)}"
            )

    @property
    def rope_scaling_key(self) -> str:
        """Canonical text of the RoPE scaling ("" for none): part of the prefix-cache namespace,
        so KV rotated with other frequencies is never reused."""
        if self.rope_freq_factors is None:
            return ""
        values = ",".join(float(f).hex() for f in self.rope_freq_factors)
        return f"{self.rope_scaling or 'freq_factors'}:{values}"

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query head h reads kv head h // num_queries_per_kv."""
        return self.num_heads // self.num_kv_heads
