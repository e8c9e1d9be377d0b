"""CLIP's text transformer: causal attention, pooled at end-of-text."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.models.transformer import Transformer


class TextTransformer(nnx.Module):
  """The text tower of CLIP.

  Parameters: `token_embed` (embedding [vocab_size, width]), `pos_embed`
  [context_length, width], `blocks`, `norm` (CLIP's ln_final) and `proj`
  (kernel [width, output_dim], CLIP's text_projection).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the tower a `spec.Text` describes."""
    self.spec = spec
    width = spec.blocks.width
    self.token_embed = nnx.Embed(
      spec.vocab_size,
      width,
      embedding_init=nnx.initializers.normal(0.02),
      rngs=rngs,
    )
    self.pos_embed = nnx.Param(
      nnx.initializers.normal(0.01)(rngs.params(), (spec.context_length, width))
    )
    self.blocks = Transformer(spec.blocks, rngs=rngs)
    self.norm = nnx.LayerNorm(width, epsilon=spec.blocks.ln_eps, rngs=rngs)
    self.proj = nnx.Linear(
      width,
      spec.output_dim,
      use_bias=False,
      dtype=spec.blocks.compute.dtype,
      kernel_init=nnx.initializers.normal(width**-0.5),
      rngs=rngs,
    )

  context_length = property(lambda self: self.spec.context_length)

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
