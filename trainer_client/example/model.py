"""A tiny T5-style encoder-decoder in plain JAX, enough to train on span corruption for real.

One encoder and one decoder layer (pre-norm RMSNorm, multi-head attention, ReLU MLP), sinusoidal
positions, embeddings tied with the output layer, loss = mean cross-entropy over non-PAD targets
(0 is PAD, as in T5). Parameters are a flat ``{name: array}`` dict, so a checkpoint is one ``.npz``.
Partitioning follows t5x's rules on the ``model`` axis: the vocabulary of the embedding, attention
heads and the MLP's hidden units are split across it; norms are replicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from trainer_client.arrays import MODEL_AXIS

__all__ = ["ModelConfig", "init_params", "loss_fn", "param_shapes", "param_specs"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32128
    d_model: int = 32
    num_heads: int = 2
    head_dim: int = 16
    d_ff: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Model {field.name} must be a positive integer but got {value!r}.")

    def check_model_axis(self, size: int) -> None:
        for name, value in (
            ("vocab_size", self.vocab_size),
            ("num_heads", self.num_heads),
            ("d_ff", self.d_ff),
        ):
            if value % size:
                raise ValueError(
                    f"Model {name} ({value}) must be a multiple of the mesh's model axis size ({size}): it is "
                    f"split across that axis. Use a model axis size that divides {value}."
                )


def _shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], PartitionSpec]]:
    d, inner, f = config.d_model, config.num_heads * config.head_dim, config.d_ff
    columns, rows, replicated = (
        PartitionSpec(None, MODEL_AXIS),
        PartitionSpec(MODEL_AXIS, None),
        PartitionSpec(),
    )
    out: dict[str, tuple[tuple[int, ...], PartitionSpec]] = {"embed": ((config.vocab_size, d), rows)}
    attentions = {"encoder": ("self",), "decoder": ("self", "cross")}
    for stack, kinds in attentions.items():
        for kind in kinds:
            for w in ("q", "k", "v"):
                out[f"{stack}.{kind}.{w}"] = ((d, inner), columns)
            out[f"{stack}.{kind}.o"] = ((inner, d), rows)
            out[f"{stack}.{kind}.norm"] = ((d,), replicated)
        out[f"{stack}.mlp.wi"] = ((d, f), columns)
        out[f"{stack}.mlp.wo"] = ((f, d), rows)
        out[f"{stack}.mlp.norm"] = ((d,), replicated)
        out[f"{stack}.final_norm"] = ((d,), replicated)
    return out


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, (shape, _) in _shapes(config).items()}


def param_specs(config: ModelConfig) -> dict[str, PartitionSpec]:
    return {name: spec for name, (_, spec) in _shapes(config).items()}


def init_params(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Float32 parameters on the host, a pure function of (config, seed)."""
    out = {}
    for i, (name, (shape, _)) in enumerate(sorted(_shapes(config).items())):
        if name.endswith("norm"):
            out[name] = np.ones(shape, dtype=np.float32)
            continue
        rng = np.random.default_rng([seed, i])
        fan_in = shape[0] if name != "embed" else 1
        out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _positions(length: int, d: int) -> jax.Array:
    position = np.arange(length)[:, None]
    rates = np.exp(-np.log(10_000.0) * np.arange(0, d, 2) / d)[None, :]
    table = np.zeros((length, d), dtype=np.float32)
    table[:, 0::2] = np.sin(position * rates)
    table[:, 1::2] = np.cos(position * rates)[:, : d // 2]
    return jnp.asarray(table)


def _attention(
    p: Mapping[str, jax.Array], prefix: str, config: ModelConfig, x: jax.Array, kv: jax.Array, mask: jax.Array
) -> jax.Array:
    heads, dim = config.num_heads, config.head_dim

    def split(y: jax.Array, w: str) -> jax.Array:
        return (y @ p[f"{prefix}.{w}"]).reshape(*y.shape[:2], heads, dim)

    q, k, v = split(x, "q"), split(kv, "k"), split(kv, "v")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dim).astype(np.float32)
    logits = jnp.where(mask, logits, -1e9)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
    return out.reshape(*x.shape[:2], heads * dim) @ p[f"{prefix}.o"]


def _mlp(p: Mapping[str, jax.Array], prefix: str, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ p[f"{prefix}.wi"]) @ p[f"{prefix}.wo"]


def encode(params: Mapping[str, jax.Array], inputs: jax.Array, config: ModelConfig) -> jax.Array:
    """The encoder's output [batch, inputs length, d_model] for ``inputs`` (0 = PAD)."""
    p = params
    x = p["embed"][inputs] + _positions(inputs.shape[1], config.d_model)
    pad = (inputs != 0)[:, None, None, :]
    y = _norm(x, p["encoder.self.norm"])
    x = x + _attention(p, "encoder.self", config, y, y, pad)
    x = x + _mlp(p, "encoder.mlp", _norm(x, p["encoder.mlp.norm"]))
    return _norm(x, p["encoder.final_norm"])


def _decoder_hidden(
    params: Mapping[str, jax.Array],
    encoded: jax.Array,
    inputs: jax.Array,
    decoder_inputs: jax.Array,
    config: ModelConfig,
) -> jax.Array:
    p = params
    length = decoder_inputs.shape[1]
    pad = (inputs != 0)[:, None, None, :]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]
    z = p["embed"][decoder_inputs] + _positions(length, config.d_model)
    y = _norm(z, p["decoder.self.norm"])
    z = z + _attention(p, "decoder.self", config, y, y, causal)
    z = z + _attention(p, "decoder.cross", config, _norm(z, p["decoder.cross.norm"]), encoded, pad)
    z = z + _mlp(p, "decoder.mlp", _norm(z, p["decoder.mlp.norm"]))
    return _norm(z, p["decoder.final_norm"])


def _logits(params: Mapping[str, jax.Array], hidden: jax.Array, config: ModelConfig) -> jax.Array:
    # Tied embeddings: scaled so that initial logits are O(1), as T5 does.
    return (hidden @ params["embed"].T) * (config.d_model**-0.5)


def decoder_logits(
    params: Mapping[str, jax.Array],
    encoded: jax.Array,
    inputs: jax.Array,
    decoder_inputs: jax.Array,
    config: ModelConfig,
) -> jax.Array:
    """Logits [batch, targets length, vocab] of every position given ``decoder_inputs`` (starting at PAD)."""
    return _logits(params, _decoder_hidden(params, encoded, inputs, decoder_inputs, config), config)


def loss_fn(
    params: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], config: ModelConfig
) -> jax.Array:
    """Mean cross-entropy of ``targets`` given ``inputs`` ([batch, length] int32, 0 = PAD)."""
    inputs, targets = batch["inputs"], batch["targets"]
    # Teacher forcing: the decoder sees the targets shifted right by one, starting from PAD (0).
    decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    logits = decoder_logits(params, encode(params, inputs, config), inputs, decoder_inputs, config)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    losses = jax.nn.logsumexp(logits, axis=-1) - target_logit
    weights = (targets != 0).astype(jnp.float32)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
