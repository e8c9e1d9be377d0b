"""VideoMAE pretraining (masked tubelet reconstruction) and a video classifier.

The encoder sees only the visible tokens (10% at the usual 90% tube masking),
which is what makes VideoMAE cheap; a light decoder fills in the masked ones.
`Classifier` fine-tunes a ViT from either pretraining: VideoMAE style (no
class token, sinusoid positions, mean pooling) or CLIP style (class token,
learned positions, token pooling).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.models.probe import AttentiveProbe
from vidjax.models.transformer import Transformer, dropout_stream
from vidjax.models.vit import VisionTransformer, patchify, sincos_table

__all__ = [
  "BACKBONE_STYLES",
  "Classifier",
  "VideoMAE",
  "num_masked_tokens",
  "patchify",
]

# Architecture switches that differ between the two pretrainings (the
# names are `defaults.BACKBONES`).
BACKBONE_STYLES = {
  "videomae": dict(
    class_token=False,
    pos_embed="sincos",
    pre_norm=False,
    patch_bias=True,
    act="gelu",
    ln_eps=1e-6,
  ),
  "clip": dict(
    class_token=True,
    pos_embed="learned",
    pre_norm=True,
    patch_bias=False,
    act="quick_gelu",
    ln_eps=1e-5,
  ),
}


def num_masked_tokens(grid: tuple[int, int, int], mask_ratio: float) -> int:
  """Masked tokens per clip under VideoMAE's tube masking.

  Args:
    grid: tokens along (time, rows, columns), i.e. (T/t, H/p, W/p).
    mask_ratio: fraction of each frame's patches masked.

  Returns:
    int(mask_ratio * rows * columns) * time, as VideoMAE counts.
  """
  time, rows, columns = grid
  return int(mask_ratio * rows * columns) * time


def normalize_patches(patches: jax.Array, channels: int = 3) -> jax.Array:
  """Per patch and channel: subtract the mean, divide by the (unbiased) std.

  Args:
    patches: [B, M, t*p*p*C] from `patchify`.
    channels: C.

  Returns:
    float32 array of the same shape.
  """
  shape = patches.shape
  x = patches.astype(jnp.float32).reshape(shape[:-1] + (-1, channels))
  mean = x.mean(axis=-2, keepdims=True)
  std = jnp.sqrt(x.var(axis=-2, keepdims=True, ddof=1))
  return ((x - mean) / (std + 1e-6)).reshape(shape)


def _split_key(rngs):
  """Two independent dropout sources from a key (nnx.Rngs streams advance)."""
  if rngs is None or isinstance(rngs, nnx.Rngs):
    return rngs, rngs
  return tuple(jax.random.split(rngs))


class VideoMAE(nnx.Module):
  """VideoMAE pretraining model.

  Parameters: `encoder` (a VisionTransformer, VideoMAE style),
  `encoder_to_decoder` (kernel [D, Dd], no bias), `mask_token` [Dd],
  `decoder` (blocks), `decoder_norm`, `decoder_head` (kernel [Dd, t*p*p*3]).
  The blocks' LayerNorm eps is the encoder's last norm's too;
  `spec.decoder_ln_eps` (None: the blocks') is the decoder's last (Hugging
  Face's is PyTorch's default 1e-5 beside its blocks' 1e-12).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the model a `spec.VideoMAESpec` describes."""
    self.spec = spec
    self.encoder = VisionTransformer(spec.encoder, rngs=rngs)
    self.num_masked = num_masked_tokens(self.encoder.grid, spec.mask_ratio)
    if not 0 < self.num_masked < self.encoder.num_patches:
      raise ValueError(
        f"mask_ratio={spec.mask_ratio} masks {self.num_masked} of "
        f"{self.encoder.num_patches} tokens; need at least one "
        "masked and one visible"
      )
    decoder, dtype = spec.decoder, spec.decoder.compute.dtype
    self.encoder_to_decoder = nnx.Linear(
      spec.encoder.blocks.width,
      decoder.width,
      use_bias=False,
      dtype=dtype,
      kernel_init=nnx.initializers.xavier_uniform(),
      rngs=rngs,
    )
    self.mask_token = nnx.Param(
      nnx.initializers.normal(0.02)(rngs.params(), (decoder.width,))
    )
    self.decoder = Transformer(decoder, rngs=rngs)
    self.decoder_norm = nnx.LayerNorm(
      decoder.width,
      epsilon=decoder.ln_eps
      if spec.decoder_ln_eps is None
      else spec.decoder_ln_eps,
      rngs=rngs,
    )
    patch = spec.encoder.patch_size
    self.decoder_head = nnx.Linear(
      decoder.width,
      spec.encoder.tubelet * patch * patch * 3,
      dtype=dtype,
      kernel_init=nnx.initializers.xavier_uniform(),
      rngs=rngs,
    )

  norm_pix_loss = property(lambda self: self.spec.norm_pix_loss)
  decoder_width = property(lambda self: self.spec.decoder.width)

  def __call__(
    self,
    video: jax.Array,
    mask: jax.Array,
    *,
    deterministic: bool = True,
    rngs=None,
    return_predictions: bool = False,
  ):
    """Reconstruction loss on the masked tubelets.

    Args:
      video: float32[B, T, H, W, 3], normalised (the targets are these
        values; with `norm_pix_loss` each target patch is renormalised, so
        the input normalisation does not matter).
      mask: bool[B, N], True = masked, N = (T/t)*(H/p)*(W/p) in (time, row,
        column) order, exactly `self.num_masked` per example (tube masking at
        the configured ratio). A different count gives a NaN loss.
      deterministic: disables drop path when True.
      rngs: optional nnx.Rngs or key for drop path.
      return_predictions: also return the predictions and targets.

    Returns:
      float32 scalar loss (mean squared error over masked patches), or
      (loss, predictions float32[B, M, t*p*p*3], targets of the same shape)
      with M = `num_masked`, masked tokens in increasing index order.
    """
    encoder = self.encoder
    num_patches, num_masked = encoder.num_patches, self.num_masked
    if mask.shape != (video.shape[0], num_patches):
      raise ValueError(
        f"mask of shape {mask.shape} does not match "
        f"[batch, {num_patches}] tokens"
      )
    # Stable sort puts visible (False) tokens first, each group in order.
    order = jnp.argsort(mask.astype(jnp.int32), axis=1, stable=True)
    visible_idx, masked_idx = order[:, :-num_masked], order[:, -num_masked:]

    def gather(x, idx):
      return jnp.take_along_axis(x, idx[..., None], axis=1)

    tokens = gather(encoder.embed(video), visible_idx)
    encoder_rngs, decoder_rngs = _split_key(rngs)
    tokens = encoder.encode_tokens(
      tokens, deterministic=deterministic, rngs=encoder_rngs
    )
    tokens = self.encoder_to_decoder(encoder.head(tokens))

    positions = jnp.asarray(sincos_table(num_patches, self.decoder_width))
    positions = jnp.broadcast_to(positions, (video.shape[0],) + positions.shape)
    visible = tokens.astype(jnp.float32) + gather(positions, visible_idx)
    masked = self.mask_token[...] + gather(positions, masked_idx)
    decoded = self.decoder(
      jnp.concatenate([visible, masked], axis=1),
      deterministic=deterministic,
      rngs=decoder_rngs,
    )
    predictions = self.decoder_head(
      self.decoder_norm(decoded[:, -num_masked:])
    ).astype(jnp.float32)

    targets = gather(
      patchify(video.astype(jnp.float32), encoder.tubelet, encoder.patch_size),
      masked_idx,
    )
    if self.norm_pix_loss:
      targets = normalize_patches(targets)
    loss = jnp.mean(jnp.square(predictions - targets))
    counts_ok = jnp.all(mask.sum(axis=1) == num_masked)
    loss = jnp.where(counts_ok, loss, jnp.nan)
    if return_predictions:
      return loss, predictions, targets
    return loss


class Classifier(nnx.Module):
  """ViT + pooling + linear head, for fine-tuning either pretraining.

  Parameters: `encoder` (VisionTransformer, pool 'mean' or 'token') and
  `head` (kernel [D, num_classes]). `spec.from_config` gives the encoder
  its backbone's style (`BACKBONE_STYLES`) where the config leaves the
  activation, the LayerNorm eps or the pooling empty.

  A probe (`spec.probe`) classifies the frozen encoder's `features`
  (gradients stop there): 'linear', the head on the averaged patch tokens;
  'attentive', an `AttentiveProbe` (`probe`) over them. The probe's
  training reads features cached once (`classify` on them).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the model a `spec.ClassifierSpec` describes."""
    self.spec = spec
    self.encoder = VisionTransformer(spec.encoder, rngs=rngs)
    self.head_dropout = nnx.Dropout(
      spec.head_dropout, rngs=dropout_stream(rngs)
    )
    # Small head init (VideoMAE's init_scale) so fine-tuning starts gently.
    self.head = nnx.Linear(
      spec.encoder.blocks.width,
      spec.num_classes,
      dtype=spec.encoder.blocks.compute.dtype,
      kernel_init=nnx.initializers.normal(0.02 * spec.head_init_scale),
      rngs=rngs,
    )
    if spec.probe == "attentive":
      self.probe = AttentiveProbe(
        spec.encoder.blocks.width,
        spec.num_classes,
        heads=spec.encoder.blocks.heads,
        rngs=rngs,
      )

  def features(self, video: jax.Array) -> jax.Array:
    """What a probe reads: the encoder's patch tokens (no class token),
    each through its final norm: float32[B, N, D] for the attentive probe,
    averaged, float32[B, D], for the linear one (whatever the encoder's
    own pooling: V-JEPA 2's probes read the patch tokens)."""
    encoder = self.encoder
    tokens = encoder.prepend_class_token(encoder.embed(video))
    tokens = encoder.encode_tokens(tokens)[:, int(encoder.has_class_token) :]
    tokens = encoder.norm(tokens).astype(jnp.float32)
    return tokens if self.spec.probe == "attentive" else tokens.mean(axis=1)

  def classify(
    self, features: jax.Array, *, deterministic: bool = True, rngs=None
  ) -> jax.Array:
    """`features` (the encoder's, or `features`') -> float32[B, classes]."""
    if self.spec.probe == "attentive":
      return self.probe(features)
    features = self.head_dropout(
      features, deterministic=deterministic, rngs=rngs
    )
    return self.head(features).astype(jnp.float32)

  def __call__(
    self, video: jax.Array, *, deterministic: bool = True, rngs=None
  ) -> jax.Array:
    """float32[B, T, H, W, 3] normalised video -> float32[B, num_classes]."""
    encoder_rngs, head_rngs = _split_key(rngs)
    if self.spec.probe:
      features = jax.lax.stop_gradient(self.features(video))
    else:
      features = self.encoder(
        video, deterministic=deterministic, rngs=encoder_rngs
      )
    return self.classify(features, deterministic=deterministic, rngs=head_rngs)
