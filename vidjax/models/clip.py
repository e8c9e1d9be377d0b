"""The video-text dual encoder (CLIP with a video ViT), as in LaViLa/AVION."""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.defaults import CONTEXT_LENGTH, INIT_LOGIT_SCALE, VOCAB_SIZE
from vidjax.models.text import TextTransformer
from vidjax.models.vit import VisionTransformer

# The initial temperature is CLIP's 0.07 (`INIT_LOGIT_SCALE`, log-space).
# CLIP and AVION clamp the learned log-space scale to [0, ln 100] after each
# update (the train step does), so that exp(logit_scale) <= 100.
MAX_LOGIT_SCALE = math.log(100.0)


class Buffer(nnx.Variable):
  """Model state that is not trained (e.g. a fixed logit scale)."""


class CLIP(nnx.Module):
  """Video tower (`visual`) and text tower (`text`) into one embedding space.

  Sizes default to ViT-B/16 CLIP. `logit_scale` holds log(1/temperature) as
  in CLIP: an `nnx.Param` when learned, a `Buffer` when fixed. `norm_eps` is
  the LayerNorm eps of the video tower, `text_norm_eps` the text tower's
  (OpenAI: 1e-5 both; AVION's video tower: 1e-6). `mask_ratio` and
  `mask_kind` are the video tower's masked training (`vit` module
  docstring): the text tower and `encode_video` outside training always
  see every token.
  """

  def __init__(
    self,
    *,
    embed_dim: int = 512,
    image_size=224,
    patch_size: int = 16,
    num_frames: int = 16,
    tubelet: int = 1,
    vision_width: int = 768,
    vision_depth: int = 12,
    vision_heads: int = 12,
    vision_mlp_dim: int | None = None,
    vocab_size: int = VOCAB_SIZE,
    context_length: int = CONTEXT_LENGTH,
    text_width: int = 512,
    text_heads: int = 8,
    text_depth: int = 12,
    act: str = "quick_gelu",
    norm_eps: float = 1e-5,
    text_norm_eps: float = 1e-5,
    drop_path: float = 0.0,
    attention: str = "auto",
    remat: str = "none",
    scan: bool = False,
    dtype=jnp.float32,
    residual_dtype=jnp.float32,
    norm_dtype=jnp.float32,
    logit_scale_init: float = INIT_LOGIT_SCALE,
    learn_logit_scale: bool = True,
    mask_ratio: float = 0.0,
    mask_kind: str = "random",
    rngs: nnx.Rngs,
  ):
    self.visual = VisionTransformer(
      width=vision_width,
      depth=vision_depth,
      heads=vision_heads,
      mlp_dim=vision_mlp_dim,
      patch_size=patch_size,
      image_size=image_size,
      num_frames=num_frames,
      tubelet=tubelet,
      class_token=True,
      pos_embed="learned",
      pre_norm=True,
      pool="token",
      output_dim=embed_dim,
      patch_bias=False,
      act=act,
      norm_eps=norm_eps,
      drop_path=drop_path,
      attention=attention,
      remat=remat,
      scan=scan,
      dtype=dtype,
      residual_dtype=residual_dtype,
      norm_dtype=norm_dtype,
      mask_ratio=mask_ratio,
      mask_kind=mask_kind,
      rngs=rngs,
    )
    self.text = TextTransformer(
      vocab_size=vocab_size,
      context_length=context_length,
      width=text_width,
      heads=text_heads,
      depth=text_depth,
      output_dim=embed_dim,
      act=act,
      norm_eps=text_norm_eps,
      attention=attention,
      remat=remat,
      scan=scan,
      dtype=dtype,
      residual_dtype=residual_dtype,
      norm_dtype=norm_dtype,
      rngs=rngs,
    )
    variable = nnx.Param if learn_logit_scale else Buffer
    self.logit_scale = variable(jnp.asarray(logit_scale_init, jnp.float32))

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
