"""CLIP's text transformer: causal attention, pooled at end-of-text."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.defaults import CONTEXT_LENGTH, VOCAB_SIZE
from vidjax.models.transformer import Transformer


class TextTransformer(nnx.Module):
  """The text tower of CLIP.

  Parameters: `token_embed` (embedding [vocab_size, width]), `pos_embed`
  [context_length, width], `blocks`, `norm` (CLIP's ln_final) and `proj`
  (kernel [width, output_dim], CLIP's text_projection).
  """

  def __init__(
    self,
    *,
    vocab_size: int = VOCAB_SIZE,
    context_length: int = CONTEXT_LENGTH,
    width: int = 512,
    heads: int = 8,
    depth: int = 12,
    output_dim: int = 512,
    act: str = "quick_gelu",
    norm_eps: float = 1e-5,
    attention: str = "auto",
    remat: str = "none",
    scan: bool = False,
    dtype=jnp.float32,
    residual_dtype=jnp.float32,
    norm_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    self.context_length, self.dtype = context_length, dtype
    self.token_embed = nnx.Embed(
      vocab_size, width, embedding_init=nnx.initializers.normal(0.02), rngs=rngs
    )
    self.pos_embed = nnx.Param(
      nnx.initializers.normal(0.01)(rngs.params(), (context_length, width))
    )
    self.blocks = Transformer(
      width=width,
      depth=depth,
      heads=heads,
      mlp_dim=4 * width,
      act=act,
      norm_eps=norm_eps,
      attention=attention,
      remat=remat,
      scan=scan,
      dtype=dtype,
      residual_dtype=residual_dtype,
      norm_dtype=norm_dtype,
      rngs=rngs,
    )
    self.norm = nnx.LayerNorm(width, epsilon=norm_eps, rngs=rngs)
    self.proj = nnx.Linear(
      width,
      output_dim,
      use_bias=False,
      dtype=dtype,
      kernel_init=nnx.initializers.normal(width**-0.5),
      rngs=rngs,
    )

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Embeds token ids.

    Args:
      tokens: int32[B, L], L <= context_length, padded with 0 after the
        end-of-text token; the end-of-text token has the largest id in CLIP's
        vocabulary, so its position is the argmax (as CLIP pools).

    Returns:
      float32[B, output_dim], unnormalised.
    """
    length = tokens.shape[1]
    if length > self.context_length:
      raise ValueError(
        f"text of {length} tokens is longer than the context "
        f"length {self.context_length}"
      )
    x = self.token_embed(tokens) + self.pos_embed[...][:length]
    x = self.blocks(x, is_causal=True)
    end_of_text = jnp.argmax(tokens, axis=-1)
    # Pool, then norm: LayerNorm is per token, so this equals CLIP's order.
    pooled = jnp.take_along_axis(x, end_of_text[:, None, None], axis=1)[:, 0]
    return self.proj(self.norm(pooled)).astype(jnp.float32)
