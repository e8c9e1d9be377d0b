"""The attentive probe: learned queries cross-attending over frozen tokens.

V-JEPA 2's evaluations (its `AttentiveClassifier`) adapt a frozen encoder to
labels this way: a few learned queries attend over the encoder's patch
tokens (one cross-attention block: attention, then an MLP, each with a
residual), the queries are averaged and a linear layer classifies them.
`videomae.Classifier` holds one when `model.probe='attentive'`; its linear
probe is its own head on the pooled features.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp


class AttentiveProbe(nnx.Module):
  """Cross-attention pooling of [B, L, D] tokens, then a linear classifier.

  Parameters: `queries` [Q, D], `norm_tokens`, `attention` (nnx
  MultiHeadAttention), `norm_mlp`, `mlp` (D -> 4D -> D, GELU), `norm_out`,
  `head` (kernel [D, num_classes]).
  """

  def __init__(
    self,
    width: int,
    num_classes: int,
    *,
    heads: int,
    queries: int = 1,
    rngs: nnx.Rngs,
  ):
    self.queries = nnx.Param(
      nnx.initializers.normal(0.02)(rngs.params(), (queries, width))
    )
    self.norm_tokens = nnx.LayerNorm(width, rngs=rngs)
    self.attention = nnx.MultiHeadAttention(
      num_heads=heads, in_features=width, decode=False, rngs=rngs
    )
    self.norm_mlp = nnx.LayerNorm(width, rngs=rngs)
    self.mlp_in = nnx.Linear(width, 4 * width, rngs=rngs)
    self.mlp_out = nnx.Linear(4 * width, width, rngs=rngs)
    self.norm_out = nnx.LayerNorm(width, rngs=rngs)
    self.head = nnx.Linear(
      width,
      num_classes,
      kernel_init=nnx.initializers.normal(0.02),
      rngs=rngs,
    )

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """float[B, L, D] frozen tokens -> float32[B, num_classes] logits."""
    tokens = self.norm_tokens(tokens.astype(jnp.float32))
    queries = jnp.broadcast_to(
      self.queries[...], (tokens.shape[0],) + self.queries.shape
    )
    x = queries + self.attention(queries, tokens, tokens, deterministic=True)
    x = x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm_mlp(x))))
    return self.head(self.norm_out(x.mean(axis=1))).astype(jnp.float32)
