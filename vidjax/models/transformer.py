"""The transformer stack every tower shares: blocks, remat, drop path, scan.

Pre-LN blocks (attention, then MLP) as in CLIP, ViT and VideoMAE, stacked
by `Transformer` with per-block rematerialisation (`REMAT_POLICIES`),
stochastic depth (`drop_path_rates`) and an optional scan over depth. The
video ViT (`vit.py`), the text tower (`text.py`) and VideoMAE's decoder
(`videomae.py`) are built on it.
"""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vidjax.config import defaults
from vidjax.models.attention import MultiHeadAttention

# `defaults.ACTIVATIONS`: the functions.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  # OpenAI CLIP's sigmoid approximation of GELU.
  "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
  # PyTorch's nn.GELU(): the exact erf form, not jax's tanh default.
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


def _cudnn_attention_outputs(primitive, *_, **__) -> bool:
  """True for cuDNN's attention forward: its output and softmax statistics.

  Its backward kernel needs both; a policy that saves only the output (by
  name) makes the backward pass run the forward kernel again for the
  statistics.
  """
  return primitive.name.startswith("dot_product_attention_fwd")


_policies = jax.checkpoint_policies
# Attention's results: cuDNN's (output + statistics), or XLA's named output.
_attention_saveable = _policies.save_from_both_policies(
  _policies.save_only_these_names("attention"), _cudnn_attention_outputs
)

# What a remat'd block keeps for the backward pass ('none' = no remat). The
# more it keeps, the less the backward pass recomputes and the more memory
# it holds; each recipe says which fits what GPU (benchmarks.memory).
# The names are `defaults.REMAT_POLICIES`.
REMAT_POLICIES = {
  "none": None,
  # Block inputs only: a whole second forward (AVION's checkpointing).
  "full": _policies.nothing_saveable,
  # Attention kept: the matmuls are recomputed, attention is not.
  "save_attention": _attention_saveable,
  # Attention and every matmul output kept: only elementwise work
  # (LayerNorms, activations, residual adds) is recomputed.
  "save_dots_and_attention": _policies.save_from_both_policies(
    _policies.dots_saveable, _attention_saveable
  ),
  "dots_saveable": _policies.dots_saveable,
  "dots_with_no_batch_dims_saveable": _policies.dots_with_no_batch_dims_saveable,
}


def drop_path_rates(
  rate: float, depth: int, schedule: str = "linear"
) -> tuple[float, ...]:
  """Per-block stochastic-depth rates.

  'linear': 0 at the first block to `rate` at the last (timm, VideoMAE).
  'uniform': `rate` at every block (AVION's CLIP classifier).
  """
  if schedule not in defaults.DROP_PATH_SCHEDULES:
    raise ValueError(
      f"drop_path_schedule must be one of "
      f"{defaults.DROP_PATH_SCHEDULES}, got {schedule!r}"
    )
  if schedule == "uniform":
    return (float(rate),) * depth
  return tuple(float(r) for r in np.linspace(0, rate, depth))


def drop_path(x: jax.Array, rate, key: jax.Array | None) -> jax.Array:
  """Stochastic depth: drops residual branches per example, rescales kept."""
  if key is None:
    return x
  keep = 1.0 - rate
  mask = jax.random.bernoulli(key, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return jnp.where(mask, x / keep, 0.0)


def dropout_stream(rngs: nnx.Rngs) -> nnx.RngStream:
  """A fork of the 'dropout' stream (or 'default'), with a clear error."""
  try:
    return rngs["dropout"].fork()
  except KeyError:
    raise ValueError(
      "models need a 'dropout' (or 'default') stream in rngs, "
      "e.g. nnx.Rngs(params=0, dropout=1)"
    ) from None


class Mlp(nnx.Module):
  """Two linear layers with an activation between (CLIP's c_fc/c_proj)."""

  def __init__(
    self, width: int, hidden: int, *, act: str, dtype, rngs: nnx.Rngs
  ):
    if act not in ACTIVATIONS:
      raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {act!r}")
    self.act = act
    init = nnx.initializers.xavier_uniform()
    self.fc1 = nnx.Linear(
      width, hidden, dtype=dtype, kernel_init=init, rngs=rngs
    )
    self.fc2 = nnx.Linear(
      hidden, width, dtype=dtype, kernel_init=init, rngs=rngs
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc2(ACTIVATIONS[self.act](self.fc1(x)))


class LayerNorm(nnx.LayerNorm):
  """`nnx.LayerNorm` (parameters `scale`, `bias`) whose statistics may run in
  bfloat16 (`stats_dtype`); flax computes them in float32 at least."""

  def __init__(self, width: int, *, stats_dtype=jnp.float32, **kwargs):
    super().__init__(width, **kwargs)
    self.stats_dtype = stats_dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    if jnp.dtype(self.stats_dtype) == jnp.float32:
      return super().__call__(x)
    x = x.astype(self.stats_dtype)
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    y = centred * jax.lax.rsqrt(
      jnp.square(centred).mean(-1, keepdims=True) + self.epsilon
    )
    y = y * self.scale[...].astype(x.dtype) + self.bias[...].astype(x.dtype)
    return y.astype(self.dtype or x.dtype)


class Block(nnx.Module):
  """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x)), of a
  `spec.Stack`."""

  def __init__(self, spec, *, rngs: nnx.Rngs):
    compute = spec.compute
    norm = dict(
      epsilon=spec.ln_eps, dtype=compute.dtype, stats_dtype=compute.norm_dtype
    )
    self.norm1 = LayerNorm(spec.width, **norm, rngs=rngs)
    self.attn = MultiHeadAttention(
      spec.width,
      spec.heads,
      qkv_bias=spec.qkv_bias,
      implementation=compute.attention,
      dtype=compute.dtype,
      rngs=rngs,
    )
    self.norm2 = LayerNorm(spec.width, **norm, rngs=rngs)
    self.mlp = Mlp(
      spec.width, spec.mlp_dim, act=spec.act, dtype=compute.dtype, rngs=rngs
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    drop_rate,
    key: jax.Array | None,
    is_causal: bool = False,
  ) -> jax.Array:
    keys = (None, None) if key is None else jax.random.split(key)
    x = x + drop_path(
      self.attn(self.norm1(x), is_causal=is_causal), drop_rate, keys[0]
    )
    return x + drop_path(self.mlp(self.norm2(x)), drop_rate, keys[1])


class Transformer(nnx.Module):
  """A stack of blocks (a `spec.Stack`), with per-block remat and optional
  scan over depth.

  Drop path grows linearly from 0 at the first block to `drop_path` at the
  last, or `drop_path` gives one rate per block (`drop_path_rates`). With
  `scan=True` the block parameters are stacked on a leading depth axis
  (`layers.<name>` of shape [depth, ...]), which compiles one block
  instead of `depth`; otherwise they are `layers.<i>.<name>`.
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    if spec.compute.remat not in REMAT_POLICIES:
      raise ValueError(
        f"remat must be one of {sorted(REMAT_POLICIES)}, "
        f"got {spec.compute.remat!r}"
      )
    if len(spec.drop_path) != spec.depth:
      raise ValueError(
        f"{len(spec.drop_path)} drop-path rates for {spec.depth} blocks"
      )
    self.spec = spec

    def make_block(block_rngs):
      return Block(spec, rngs=block_rngs)

    if spec.compute.scan:
      make_stack = nnx.split_rngs(splits=spec.depth)(
        nnx.vmap(make_block, in_axes=0, out_axes=0)
      )
      self.layers = make_stack(rngs)
    else:
      self.layers = nnx.List([make_block(rngs) for _ in range(spec.depth)])
    self.dropout_rngs = dropout_stream(rngs)

  @property
  def depth(self) -> int:
    return self.spec.depth

  @property
  def remat(self) -> str:
    return self.spec.compute.remat

  @property
  def scan(self) -> bool:
    return self.spec.compute.scan

  @property
  def residual_dtype(self):
    return self.spec.compute.residual_dtype

  @property
  def drop_rates(self) -> tuple[float, ...]:
    return self.spec.drop_path

  def __call__(
    self,
    x: jax.Array,
    *,
    deterministic: bool = True,
    rngs: nnx.Rngs | jax.Array | None = None,
    is_causal: bool = False,
    outputs: int = 0,
  ) -> jax.Array:
    """Runs the blocks.

    Args:
      x: [B, L, D] tokens (any float dtype; the stream is kept in
        `residual_dtype`).
      deterministic: no drop path when True.
      rngs: optional nnx.Rngs (its 'dropout' stream is used) or a key, in
        place of the stream stored at construction.
      is_causal: causal attention (text tower).
      outputs: > 0: return the outputs of the last `outputs` blocks
        (a distilled student's and its teacher's aligned layers).

    Returns:
      residual_dtype[B, L, D], or residual_dtype[outputs, B, L, D] (the
      blocks in order, the last block's output last) with `outputs`.
    """
    if not 0 <= outputs <= self.depth:
      raise ValueError(f"outputs={outputs} of {self.depth} blocks")
    x = x.astype(self.residual_dtype)
    keys = None
    if not deterministic and max(self.drop_rates) > 0:
      if rngs is None:
        key = self.dropout_rngs()
      elif isinstance(rngs, nnx.Rngs):
        key = rngs["dropout"]()
      else:
        key = rngs
      keys = jax.random.split(key, self.depth)

    def run_block(block, x, rate, key):
      # A compute dtype wider than the stream would widen it block by block.
      return block(x, drop_rate=rate, key=key, is_causal=is_causal).astype(
        x.dtype
      )

    if self.remat != "none":
      run_block = nnx.remat(run_block, policy=REMAT_POLICIES[self.remat])
    if self.scan:
      if outputs:  # Every block's output, the last `outputs` kept.
        scan_all = nnx.scan(
          lambda *a: (lambda y: (y, y))(run_block(*a)),
          in_axes=(0, nnx.Carry, 0, 0),
          out_axes=(nnx.Carry, 0),
        )
        rates = jnp.asarray(self.drop_rates)
        return scan_all(self.layers, x, rates, keys)[1][-outputs:]
      scan_blocks = nnx.scan(
        run_block, in_axes=(0, nnx.Carry, 0, 0), out_axes=nnx.Carry
      )
      return scan_blocks(self.layers, x, jnp.asarray(self.drop_rates), keys)
    kept = []
    for i, block in enumerate(self.layers):
      x = run_block(
        block, x, self.drop_rates[i], None if keys is None else keys[i]
      )
      if i >= self.depth - outputs:
        kept.append(x)
    return jnp.stack(kept) if outputs else x
