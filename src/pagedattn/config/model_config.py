"""ModelConfig: the model's shapes and numerics, and the activation dtypes."""

from __future__ import annotations

import math
from dataclasses import dataclass

# How block-quantized projections meet their inputs (pagedattn.model.quantized.qmatmul):
# float32 is exact, int8 (opt-in, not exact) quantizes them per 32-input block as llama.cpp does.
ACTIVATIONS = ("float32", "int8")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder of one of the families in
    :mod:`pagedattn.model.architecture` (``architecture`` names it; the family decides which
    tensors exist: biases, q/k norms, the extra norms, the activation).

    ``rope_freq_factors``: None (plain RoPE), or one positive divisor per rotary pair
    (head_dim // 2 floats) applied to the frequencies ``rope_theta^(-2i/head_dim)``: Llama-3.1
    scaling (GGUF ``rope_freqs.weight``, HF ``rope_scaling: {rope_type: llama3}``).
    ``rope_scaling`` names where they came from ("" for none, "llama3").

    Per-layer attention: ``layer_windows`` is None (every layer attends to its whole context)
    or one int per layer, 0 for full attention, W > 0 for a sliding window of W tokens
    (``p - W < j <= p``). Sliding layers rotate with ``rope_theta_local`` and no frequency
    divisors when it is set (Gemma 3), else like the full layers. ``attn_scale`` multiplies
    ``q . k`` (None: ``1 / sqrt(head_dim)``; Gemma: ``query_pre_attn_scalar ** -0.5``);
    ``embed_scale`` multiplies the embedding rows (Gemma: ``sqrt(hidden_size)``);
    ``final_logit_softcap`` C, when set, maps logits to ``C * tanh(logits / C)``.

    Raises:
        ValueError: a non-positive size, num_heads not a multiple of num_kv_heads,
            rope_freq_factors of the wrong length or not all positive, layer_windows whose
            length is not num_layers or with a window < 0 or beyond max_position_embeddings,
            or a non-positive scale, RoPE base or soft cap.
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
    layer_windows: tuple[int, ...] | None = None
    rope_theta_local: float | None = None
    attn_scale: float | None = None
    embed_scale: float = 1.0
    final_logit_softcap: float | None = None

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

        self._check_layers()

    def _check_layers(self) -> None:
        windows = self.layer_windows
        if windows is not None:
            if len(windows) != self.num_layers:
                raise ValueError(
                    f"ModelConfig.layer_windows: expected one entry per layer ({self.num_layers}), "
                    f"got {len(windows)}"
                )
            bad = [w for w in windows if not isinstance(w, int) or w < 0]
            if bad or max(windows, default=0) > self.max_position_embeddings:
                raise ValueError(
                    "ModelConfig.layer_windows: each window must be 0 (full attention) or a "
                    f"positive int <= max_position_embeddings ({self.max_position_embeddings}), "
                    f"got {sorted(set(windows))}"
                )
        for name in ("rope_theta_local", "attn_scale", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {value!r}")
        if not self.embed_scale > 0:
            raise ValueError(f"ModelConfig.embed_scale must be positive, got {self.embed_scale!r}")

    def layer_window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window W, or None when it attends to its whole context."""
        if self.layer_windows is None or self.layer_windows[layer] == 0:
            return None
        return self.layer_windows[layer]

    def layer_rope(self, layer: int) -> tuple[float, tuple[float, ...] | None]:
        """(RoPE base, frequency divisors or None) that layer ``layer`` rotates q and k with."""
        if self.rope_theta_local is not None and self.layer_window(layer) is not None:
            return self.rope_theta_local, None
        return self.rope_theta, self.rope_freq_factors

    @property
    def attention_scale(self) -> float:
        """The multiplier of ``q . k`` (``attn_scale``, or ``1 / sqrt(head_dim)``)."""
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

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
