"""The video-text dual encoder (CLIP with a video ViT), as in LaViLa/AVION."""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.models.text import TextTransformer
from vidjax.models.vit import VisionTransformer

# The initial temperature is CLIP's 0.07 (`defaults.INIT_LOGIT_SCALE`,
# log-space).
# CLIP and AVION clamp the learned log-space scale to [0, ln 100] after each
# update (the train step does), so that exp(logit_scale) <= 100.
MAX_LOGIT_SCALE = math.log(100.0)


class Buffer(nnx.Variable):
  """Model state that is not trained (e.g. a fixed logit scale)."""


class CLIP(nnx.Module):
  """Video tower (`visual`) and text tower (`text`) into one embedding space.

  `logit_scale` holds log(1/temperature) as in CLIP: an `nnx.Param` when
  learned, a `Buffer` when fixed. Each tower has its own LayerNorm eps
  (OpenAI: 1e-5 both; AVION's video tower: 1e-6). The video tower's
  `mask_ratio` and `mask_kind` are its masked training (`vit` module
  docstring): the text tower and `encode_video` outside training always
  see every token.
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the model a `spec.ClipSpec` describes."""
    self.spec = spec
    self.visual = VisionTransformer(spec.vision, rngs=rngs)
    self.text = TextTransformer(spec.text, rngs=rngs)
    variable = nnx.Param if spec.learn_logit_scale else Buffer
    self.logit_scale = variable(jnp.asarray(spec.logit_scale_init, jnp.float32))

  def encode_video(
    self, video: jax.Array, *, deterministic: bool = True, rngs=None
  ) -> jax.Array:
    """Embeds clips.

    Args:
      video: float32[B, T, H, W, 3], already normalised.
      deterministic: disables drop path, and the token masking of training
        (`mask_ratio`), when True.
      rngs: optional nnx.Rngs or key for drop path and masking (else the
        stored 'dropout' stream).

    Returns:
      float32[B, embed_dim], unnormalised.
    """
    return self.visual(video, deterministic=deterministic, rngs=rngs)

  def encode_text(self, tokens: jax.Array) -> jax.Array:
    """Embeds int32[B, 77] token ids -> float32[B, embed_dim], unnormalised."""
    return self.text(tokens)

  def __call__(
    self,
    video: jax.Array,
    tokens: jax.Array,
    *,
    deterministic: bool = True,
    rngs=None,
  ) -> tuple[jax.Array, jax.Array]:
    """Both embeddings: (float32[B, embed_dim], float32[B, embed_dim])."""
    return (
      self.encode_video(video, deterministic=deterministic, rngs=rngs),
      self.encode_text(tokens),
    )
