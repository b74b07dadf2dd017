"""The decoder forward in PyTorch (CPU or CUDA) over a torch page pool.

The same families (:mod:`pagedattn.model.architecture`: biases, q/k norms, Gemma's extra norms
and tanh-GELU, per-layer windows, RoPE bases and attention scale) and contract as
:class:`pagedattn.model.decoder.DecoderModel` (Touvron et al.
2023, arXiv 2302.13971, as ``transformers.models.llama.modeling_llama``: RMSNorm, Zhang &
Sennrich 2019; rotate-half RoPE, Su et al. 2021, with the llama3 frequency divisors; SwiGLU,
Shazeer 2020; grouped-query attention, Ainslie et al. 2023). The host hands it a
:class:`~pagedattn.model.forward_batch.ForwardBatch` of NumPy ints; ids, RoPE tables, slots and
page tables go to the device once per step (:class:`TorchStepAttention`), activations and the
KV pool stay there for the whole step, and only the requested rows' float32 logits come back
as a NumPy array, so sampling on the host is the same on every backend.

Weights: GGUF blocks (Q4_0 ... Q8_0, the K-quants) are dequantized once (bit-identical to
``gguf.quants.dequantize``) and every matrix is stored on the device in ``dtype`` (float32 by
default; float16 / bfloat16 trade exactness for speed on CUDA). The KV pool stays float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedattn.backends import BackendSpec, array_module, resolve_backend
from pagedattn.config import ModelConfig
from pagedattn.kernels.rope import rope_cos_sin
from pagedattn.model.architecture import architecture_of, expected_weight_shapes
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.quantized import BlockQuantized, Matrix
from pagedattn.model.torch_attention import TorchStepAttention
from pagedattn.model.weights import check_weights

if TYPE_CHECKING:
    from pagedattn.model.loader import LoadedModel

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class _TorchLayer:
    attn_norm: Any  # (H,)
    qkv: Any  # ((nh + 2 nkv) * D, H): q, k, v rows stacked
    o: Any  # (H, nh * D)
    mlp_norm: Any  # (H,)
    gate_up: Any  # (2 I, H): gate rows then up rows
    down: Any  # (H, I)
    by_role: dict[str, Any]  # every tensor the table loaded, by role (device views)
    qkv_bias: Any = None  # ((nh + 2 nkv) * D,)
    q_norm: Any = None  # (D,)
    k_norm: Any = None  # (D,)
    post_attn_norm: Any = None  # (H,)
    post_mlp_norm: Any = None  # (H,)


class TorchLlamaModel:
    """A Llama-architecture decoder on a torch device, reading K/V from a torch page pool.

    Args:
        config: model shape and numerics.
        weights: float32 tensors by Hugging Face name ((out, in) linears, q/k in HF order);
            names present in ``quantized`` are read from there instead.
        quantized: GGUF block matrices (``LoadedModel.quantized``), dequantized once.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: weight and activation dtype, one of :data:`DTYPES` (float32 by default).

    Raises:
        ValueError: a missing tensor or a shape that disagrees with ``config``; an unknown dtype.
        pagedattn.backends.BackendError: torch is missing, or CUDA was asked for and none exists.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, np.ndarray],
        quantized: Mapping[str, BlockQuantized] | None = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
        self.backend: BackendSpec = resolve_backend("torch", device)
        torch = array_module(self.backend)
        self.torch = torch
        self.config = config
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        blocks = dict(quantized or {})
        stored: dict[str, Matrix] = {
            n: blocks[n] if n in blocks else weights[n]
            for n in expected_weight_shapes(config)
            if n in blocks or n in weights
        }
        check_weights(config, stored, "TorchLlamaModel weights")
        self.arch = architecture_of(config)
        self._silu = self.arch.activation == "silu"

        def host(name: str) -> np.ndarray:
            w = stored[name]
            return w.dequantize() if isinstance(w, BlockQuantized) else np.asarray(w, np.float32)

        def dev(*names: str) -> Any:
            arr = np.concatenate([host(n) for n in names]) if len(names) > 1 else host(names[0])
            arr = np.array(arr, dtype=np.float32)  # writable copy: GGUF arrays are read-only
            return torch.from_numpy(arr).to(self.device, self.dtype)

        arch = self.arch
        self.embed = dev(arch.hf_name("embed"))  # (V, H)
        self.lm_head = self.embed if config.tie_word_embeddings else dev(arch.hf_name("lm_head"))
        self.final_norm = dev(arch.hf_name("final_norm"))  # (H,)
        self.layers: list[_TorchLayer] = []
        roles = arch.layer_roles
        for i in range(config.num_layers):

            def n(role: str, i: int = i) -> str:
                return arch.hf_name(role, i)

            qkv, gate_up = dev(n("q"), n("k"), n("v")), dev(n("gate"), n("up"))
            q_rows, kv_rows = (
                config.num_heads * config.head_dim,
                config.num_kv_heads * config.head_dim,
            )
            inter = config.intermediate_size
            by_role = {
                "q": qkv[:q_rows], "k": qkv[q_rows : q_rows + kv_rows],
                "v": qkv[q_rows + kv_rows :], "gate": gate_up[:inter], "up": gate_up[inter:],
            }  # fmt: skip
            for role in roles:
                if role not in by_role:
                    by_role[role] = dev(n(role))
            bias = None
            if arch.qkv_bias:
                bias = torch.cat([by_role["q_bias"], by_role["k_bias"], by_role["v_bias"]])
            self.layers.append(
                _TorchLayer(
                    attn_norm=by_role["attn_norm"],
                    qkv=qkv,
                    o=by_role["o"],
                    mlp_norm=by_role["mlp_norm"],
                    gate_up=gate_up,
                    down=by_role["down"],
                    by_role={r: by_role[r] for r in roles},
                    qkv_bias=bias,
                    q_norm=by_role.get("q_norm"),
                    k_norm=by_role.get("k_norm"),
                    post_attn_norm=by_role.get("post_attn_norm"),
                    post_mlp_norm=by_role.get("post_mlp_norm"),
                )
            )

    def named_tensors(self) -> list[tuple[str, Any]]:
        """Every tensor the table loaded, named as
        :meth:`pagedattn.model.decoder.DecoderModel.named_tensors` names them."""
        out: list[tuple[str, Any]] = [("embed", self.embed)]
        if self.lm_head is not self.embed:
            out.append(("lm_head", self.lm_head))
        out.append(("final_norm", self.final_norm))
        for i, layer in enumerate(self.layers):
            out += [(f"layers.{i}.{role}", t) for role, t in layer.by_role.items()]
        return out

    @classmethod
    def from_loaded(
        cls, loaded: LoadedModel, *, device: str = "cpu", dtype: str = "float32"
    ) -> TorchLlamaModel:
        """The model of a :func:`pagedattn.model.loader.load_model` result on ``device``."""
        return cls(loaded.config, loaded.weights, loaded.quantized, device=device, dtype=dtype)

    def kv_shape(self, num_pages: int, page_size: int) -> tuple[int, int, int, int, int, int]:
        """Shape of the KV pool this model reads: (layers, 2, num_pages, kv_heads, page_size, D)."""
        c = self.config
        return (c.num_layers, 2, num_pages, c.num_kv_heads, page_size, c.head_dim)

    def _check_kv(self, kv: Any) -> None:
        c = self.config
        torch = self.torch
        expected = (c.num_layers, 2, c.num_kv_heads, c.head_dim)
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else ()
        got = (shape[0], shape[1], shape[3], shape[5]) if len(shape) == 6 else None
        if (
            got != expected
            or kv.dtype != torch.float32
            or kv.device.type != self.device.type
            or not kv.is_contiguous()
        ):
            raise ValueError(
                f"kv: expected a contiguous float32 torch tensor on {self.device.type} "
                f"(num_layers={c.num_layers}, 2, num_pages, num_kv_heads={c.num_kv_heads}, "
                f"page_size, head_dim={c.head_dim}), got {type(kv).__name__} "
                f"{getattr(kv, 'dtype', '')} {shape}"
            )

    def _rms_norm(self, x: Any, weight: Any) -> Any:
        """RMSNorm in float32 whatever the activation dtype (as transformers' LlamaRMSNorm)."""
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        return (xf * self.torch.rsqrt(var + self.config.rms_norm_eps)).to(x.dtype) * weight

    def _rope_tables(self, positions: np.ndarray) -> list[tuple[Any, Any]]:
        """Each layer's (T, 1, D/2) cos and sin on the device (angles in float64 on the host,
        as NumPy's; one table per distinct RoPE base)."""
        c = self.config
        to = self.torch.from_numpy
        by_rope: dict[Any, tuple[Any, Any]] = {}
        out = []
        for li in range(c.num_layers):
            theta, factors = c.layer_rope(li)
            if (theta, factors) not in by_rope:
                cos, sin = rope_cos_sin(positions, c.head_dim, theta, factors)
                by_rope[theta, factors] = (
                    to(cos).to(self.device, self.dtype)[:, None],
                    to(sin).to(self.device, self.dtype)[:, None],
                )
            out.append(by_rope[theta, factors])
        return out

    def forward(self, batch: ForwardBatch, kv: Any, attention_mass: Any | None = None) -> Any:
        """Run the new tokens of ``batch`` through the model, writing their K/V into ``kv``.

        Args:
            batch: the flat batch (host NumPy arrays; see :class:`ForwardBatch`).
            kv: float32 torch tensor ``(num_layers, 2, num_pages, num_kv_heads, page_size,
                head_dim)`` on this model's device; updated in place at ``batch.slot_mapping``.
            attention_mass: must be None: the per-page attention mass (H2O eval) is computed
                by the NumPy backend only.

        Returns:
            float32 NumPy ``(len(batch.logits_indices), vocab_size)`` logits of the requested
            rows.

        Raises:
            ValueError: ``attention_mass`` given, a KV pool of the wrong shape / dtype /
                device, token ids outside the vocabulary, or slots / page ids outside the pool.
        """
        if attention_mass is not None:
            raise ValueError(
                "attention_mass: the torch backend does not compute per-page attention mass "
                "(h2o); use backend numpy"
            )
        torch, c = self.torch, self.config
        self._check_kv(kv)
        T, nh, nkv, D = batch.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
        ids = np.asarray(batch.input_ids, dtype=np.int64)
        if T and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids must be in [0, {c.vocab_size})")
        with torch.inference_mode():
            steps: dict[int | None, TorchStepAttention] = {}
            ropes = self._rope_tables(batch.positions)
            sinks = None
            if batch.sink_positions is not None:
                sinks = self._rope_tables(batch.sink_positions)
            linear, F = torch.nn.functional.linear, torch.nn.functional
            x = self.embed[torch.from_numpy(ids).to(self.device)]  # (T, H)
            if c.embed_scale != 1.0:
                x = x * torch.tensor(c.embed_scale, dtype=x.dtype, device=self.device)
            for li, layer in enumerate(self.layers):
                window = c.layer_window(li)
                step = steps.get(window)
                if step is None:
                    step = steps[window] = TorchStepAttention(
                        torch, batch, kv.shape[4], kv.shape[2], self.device,
                        layer_window=window, scale=c.attn_scale,
                    )  # fmt: skip
                h = self._rms_norm(x, layer.attn_norm)
                qkv = linear(h, layer.qkv, layer.qkv_bias)  # (T, (nh + 2 nkv) D)
                q = qkv[:, : nh * D].reshape(T, nh, D)
                k = qkv[:, nh * D : (nh + nkv) * D].reshape(T, nkv, D)
                v = qkv[:, (nh + nkv) * D :].reshape(T, nkv, D)
                if layer.q_norm is not None:
                    q, k = self._rms_norm(q, layer.q_norm), self._rms_norm(k, layer.k_norm)
                cos, sin = ropes[li]
                q_rot, k_rot = _rope(q, cos, sin), _rope(k, cos, sin)
                q_sink = None if sinks is None else _rope(q, *sinks[li])
                step.write_kv(kv[li, 0], kv[li, 1], k_rot, v)
                attn = step.attention(q_rot, q_sink, kv[li, 0], kv[li, 1])  # (T, nh, D)
                o = linear(attn.reshape(T, nh * D), layer.o)
                if layer.post_attn_norm is not None:
                    o = self._rms_norm(o, layer.post_attn_norm)
                x = x + o
                h = self._rms_norm(x, layer.mlp_norm)
                gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)  # (T, I) each
                act = F.silu(gate) if self._silu else F.gelu(gate, approximate="tanh")
                d = linear(act * up, layer.down)
                if layer.post_mlp_norm is not None:
                    d = self._rms_norm(d, layer.post_mlp_norm)
                x = x + d
            rows = x[torch.from_numpy(np.asarray(batch.logits_indices, np.int64)).to(self.device)]
            logits = linear(self._rms_norm(rows, self.final_norm), self.lm_head).float()
            if c.final_logit_softcap is not None:
                logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
            return logits.cpu().numpy()


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate-half RoPE of ``x`` ``(T, heads, D)`` with ``(T, 1, D/2)`` tables (a new tensor)."""
    import torch

    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
