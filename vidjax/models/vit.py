"""Video ViT: tubelet patches of all frames, joint space-time attention.

The model AVION trains is CLIP's ViT applied to the patches of every frame at
once. Positional information is CLIP's learned spatial table plus a learned
temporal table initialised to zero, so an image CLIP given one frame computes
exactly what it did before. VideoMAE instead uses a fixed 1-D sinusoid table
over all tokens (`pos_embed='sincos'`).

Masked training (FLIP, Li et al. CVPR 2023, for video-text): with
`mask_ratio` > 0 the tower drops that share of each clip's patch tokens in
training (`deterministic=False`), after their positions are added, and
runs its blocks on the rest: the class token and the same number of patch
tokens per clip (`num_kept_tokens`), so shapes stay static. `mask_kind`
'random' draws the kept tokens anywhere in the clip, 'tube' the same
spatial positions in every frame. Evaluation always sees every token.

Numerics: parameters are float32; matmuls and attention run in the compute
`dtype` (bfloat16 on GPU by default); the residual stream (the sum that runs
through the blocks) is `residual_dtype`: float32 by default, as under
PyTorch autocast, or bfloat16 to halve the bytes that the memory-bound part
of a step (LayerNorms, residual adds, casts) moves, at some precision cost.
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vidjax.config import defaults
from vidjax.models.transformer import Transformer

# Folded into the call's drop-path key for the draw of the kept tokens, so
# that drop path's own draws stay what they are without masking.
_MASK_STREAM = 0x6D61736B  # 'mask'.


def num_kept_tokens(
  grid: tuple[int, int, int], mask_ratio: float, mask_kind: str = "random"
) -> int:
  """Patch tokens a clip keeps in masked training.

  Args:
    grid: tokens along (time, rows, columns), i.e. (T/t, H/p, W/p).
    mask_ratio: share of the patch tokens dropped (0: none).
    mask_kind: 'random' drops int(mask_ratio * N) of the N patch tokens;
      'tube' drops int(mask_ratio * rows * columns) spatial positions in
      every time step (VideoMAE's count).

  Returns:
    The kept patch tokens, the class token not counted.
  """
  if mask_kind not in defaults.MASK_KINDS:
    raise ValueError(
      f"mask_kind must be one of {defaults.MASK_KINDS}, got {mask_kind!r}"
    )
  if not 0 <= mask_ratio < 1:
    raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
  time, rows, columns = grid
  if mask_kind == "tube":
    return time * (rows * columns - int(mask_ratio * rows * columns))
  return time * rows * columns - int(mask_ratio * time * rows * columns)


def kept_token_ids(
  key: jax.Array,
  batch: int,
  grid: tuple[int, int, int],
  mask_ratio: float,
  mask_kind: str = "random",
) -> jax.Array:
  """A random subset of each clip's patch tokens, of one size for all.

  Args:
    key: PRNG key.
    batch: clips (B).
    grid: tokens along (time, rows, columns).
    mask_ratio, mask_kind: see `num_kept_tokens`.

  Returns:
    int32[B, K] token indices in (time, row, column) order, increasing
    along each row; K = `num_kept_tokens(grid, mask_ratio, mask_kind)`.
  """
  time, rows, columns = grid
  kept = num_kept_tokens(grid, mask_ratio, mask_kind)
  spatial = rows * columns
  drawn = spatial if mask_kind == "tube" else time * spatial
  scores = jax.random.uniform(key, (batch, drawn))
  _, ids = jax.lax.top_k(scores, kept // time if mask_kind == "tube" else kept)
  ids = jnp.sort(ids, axis=1)
  if mask_kind == "tube":  # The same positions in every time step.
    ids = (jnp.arange(time)[None, :, None] * spatial + ids[:, None, :]).reshape(
      batch, kept
    )
  return ids.astype(jnp.int32)


def patchify(video: jax.Array, tubelet: int, patch: int) -> jax.Array:
  """Cuts a video into flattened tubelets, in (time, row, column) order.

  Args:
    video: [B, T, H, W, C], T divisible by `tubelet`, H and W by `patch`.
    tubelet: frames per tubelet (t).
    patch: patch side in pixels (p).

  Returns:
    [B, N, t*p*p*C], N = (T/t)*(H/p)*(W/p); features ordered (t, p, p, C),
    the order VideoMAE's reconstruction targets use.
  """
  batch, frames, height, width, channels = video.shape
  if frames % tubelet or height % patch or width % patch:
    raise ValueError(
      f"video of shape {video.shape} does not split into "
      f"{tubelet}x{patch}x{patch} tubelets"
    )
  x = video.reshape(
    batch,
    frames // tubelet,
    tubelet,
    height // patch,
    patch,
    width // patch,
    patch,
    channels,
  )
  x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7)
  return x.reshape(batch, -1, tubelet * patch * patch * channels)


def sincos_table(length: int, dim: int) -> np.ndarray:
  """VideoMAE's fixed 1-D sinusoid table: sin on even, cos on odd features.

  Returns:
    float32[length, dim].
  """
  position = np.arange(length, dtype=np.float64)[:, None]
  rate = np.power(10000.0, 2 * (np.arange(dim) // 2) / dim)
  angle = position / rate
  table = np.where(np.arange(dim) % 2 == 0, np.sin(angle), np.cos(angle))
  return table.astype(np.float32)


class VisionTransformer(nnx.Module):
  """Video ViT over tubelets of t frames x p x p pixels.

  Parameters: `patch_embed` (kernel [t*p*p*3, D]), `class_token` [D],
  `spatial_pos` [(1) + h*w, D] and `temporal_pos` [T/t, D] (learned mode),
  `pre_norm` (CLIP's ln_pre), `blocks`, `norm`, `proj` (kernel [D, E]).

  Masked training (`mask_ratio`, `mask_kind`): see the module docstring.

  Pooling: 'token' takes the first token (the class token; without one, the
  first patch token, as VideoMAE's classifiers with use_mean_pooling=False),
  'mean' the mean of the patch tokens, 'none' every token; then `norm`
  (eps `head_ln_eps`, default the blocks' `ln_eps`: Hugging Face's VideoMAE
  fc_norm uses PyTorch's 1e-5 whatever its blocks use).

  Built from a `spec.Vision` (sizes, switches, masking, its `blocks`).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the tower a `spec.Vision` describes."""
    if spec.pos_embed not in ("learned", "sincos"):
      raise ValueError(
        f"pos_embed must be 'learned' or 'sincos', got {spec.pos_embed!r}"
      )
    if spec.pool not in ("token", "mean", "none"):
      raise ValueError(
        f"pool must be 'token', 'mean' or 'none', got {spec.pool!r}"
      )
    if spec.num_frames % spec.tubelet:
      raise ValueError(
        f"num_frames={spec.num_frames} is not a multiple of "
        f"tubelet={spec.tubelet}"
      )
    height, width_px = spec.image_size
    if height % spec.patch_size or width_px % spec.patch_size:
      raise ValueError(
        f"image_size {spec.image_size} is not a multiple of patch_size "
        f"{spec.patch_size}"
      )
    num_kept_tokens(spec.grid, spec.mask_ratio, spec.mask_kind)  # Checks.
    self.spec = spec
    blocks, patch, dtype = (
      spec.blocks,
      spec.patch_size,
      spec.blocks.compute.dtype,
    )
    width = blocks.width

    self.patch_embed = nnx.Linear(
      spec.tubelet * patch * patch * 3,
      width,
      use_bias=spec.patch_bias,
      dtype=dtype,
      kernel_init=nnx.initializers.xavier_uniform(),
      rngs=rngs,
    )
    normal = nnx.initializers.normal(0.02)
    if spec.class_token:
      self.class_token = nnx.Param(normal(rngs.params(), (width,)))
    if spec.pos_embed == "learned":
      spatial_len = int(spec.class_token) + self.grid[1] * self.grid[2]
      self.spatial_pos = nnx.Param(normal(rngs.params(), (spatial_len, width)))
      # Zero, so that one frame of an image CLIP is unchanged.
      self.temporal_pos = nnx.Param(jnp.zeros((self.grid[0], width)))
    self.pre_norm = (
      nnx.LayerNorm(width, epsilon=blocks.ln_eps, rngs=rngs)
      if spec.pre_norm
      else None
    )
    self.blocks = Transformer(blocks, rngs=rngs)
    self.norm = nnx.LayerNorm(
      width,
      epsilon=blocks.ln_eps if spec.head_ln_eps is None else spec.head_ln_eps,
      rngs=rngs,
    )
    self.proj = (
      nnx.Linear(
        width,
        spec.output_dim,
        use_bias=False,
        dtype=dtype,
        kernel_init=normal,
        rngs=rngs,
      )
      if spec.output_dim
      else None
    )

  # What the spec says, as the tower's own attributes.
  width = property(lambda self: self.spec.blocks.width)
  dtype = property(lambda self: self.spec.blocks.compute.dtype)
  patch_size = property(lambda self: self.spec.patch_size)
  tubelet = property(lambda self: self.spec.tubelet)
  num_frames = property(lambda self: self.spec.num_frames)
  image_size = property(lambda self: self.spec.image_size)
  grid = property(lambda self: self.spec.grid)
  pos_embed = property(lambda self: self.spec.pos_embed)
  pool = property(lambda self: self.spec.pool)
  has_class_token = property(lambda self: self.spec.class_token)
  mask_ratio = property(lambda self: self.spec.mask_ratio)
  mask_kind = property(lambda self: self.spec.mask_kind)

  @property
  def num_patches(self) -> int:
    """Tokens per clip, class token excluded: (T/t)*(H/p)*(W/p)."""
    return math.prod(self.grid)

  def kept_token_ids(self, batch: int, rngs) -> jax.Array:
    """The patch tokens masked training keeps in a call with `rngs`.

    Args:
      batch: clips (B).
      rngs: the call's drop-path randomness: a key (the kept tokens come
        from a key folded from it, so drop path draws as without masking),
        nnx.Rngs (its 'dropout' stream), or None (the blocks' stream).

    Returns:
      int32[B, K] (`kept_token_ids` of the module; K =
      `num_kept_tokens(grid, mask_ratio, mask_kind)`).
    """
    if rngs is None:
      key = self.blocks.dropout_rngs()
    elif isinstance(rngs, nnx.Rngs):
      key = rngs["dropout"]()
    else:
      key = jax.random.fold_in(rngs, _MASK_STREAM)
    return kept_token_ids(
      key, batch, self.grid, self.mask_ratio, self.mask_kind
    )

  def drop_tokens(self, tokens: jax.Array, rngs) -> jax.Array:
    """Masked training: float32[B, N, D] patch tokens (`embed`) ->
    float32[B, K, D], those of `kept_token_ids(B, rngs)`."""
    ids = self.kept_token_ids(tokens.shape[0], rngs)
    return jnp.take_along_axis(tokens, ids[..., None], axis=1)

  def embed(self, video: jax.Array) -> jax.Array:
    """Patch and position embedding, before the class token is prepended.

    Args:
      video: float[B, T, H, W, 3], normalised.

    Returns:
      float32[B, N, D] patch tokens with their positions added.
    """
    if video.shape[1:4] != (self.num_frames,) + self.image_size:
      raise ValueError(
        f"video of shape {video.shape} does not match the model "
        f"({self.num_frames} frames of {self.image_size}); build the model "
        "with these sizes (weights.py interpolates positional embeddings)"
      )
    batch = video.shape[0]
    tokens = self.patch_embed(
      patchify(video.astype(self.dtype), self.tubelet, self.patch_size)
    )
    tokens = tokens.astype(jnp.float32)
    if self.pos_embed == "sincos":
      return tokens + sincos_table(self.num_patches, self.width)
    spatial = self.spatial_pos[...][int(self.has_class_token) :]
    tokens = tokens.reshape(batch, self.grid[0], -1, self.width)
    temporal = self.temporal_pos[...][None, :, None]
    tokens = tokens + spatial[None, None] + temporal
    return tokens.reshape(batch, -1, self.width)

  def prepend_class_token(self, tokens: jax.Array) -> jax.Array:
    """[B, N, D] -> [B, 1 + N, D] (unchanged without a class token)."""
    if not self.has_class_token:
      return tokens
    cls = self.class_token[...]
    if self.pos_embed == "learned":
      cls = cls + self.spatial_pos[...][0]
    cls = jnp.broadcast_to(cls, (tokens.shape[0], 1, self.width))
    return jnp.concatenate([cls.astype(tokens.dtype), tokens], axis=1)

  def encode_tokens(
    self, tokens: jax.Array, *, deterministic: bool = True, rngs=None
  ) -> jax.Array:
    """pre-norm and blocks on [B, L, D] tokens -> residual_dtype[B, L, D]."""
    if self.pre_norm is not None:
      tokens = self.pre_norm(tokens)
    return self.blocks(tokens, deterministic=deterministic, rngs=rngs)

  def head(self, tokens: jax.Array) -> jax.Array:
    """Final norm, pooling and projection.

    Args:
      tokens: [B, L, D] block outputs.

    Returns:
      float32[B, E] (pooled, projected when `output_dim` is set) or
      float32[B, L, D] for pool='none'.
    """
    if self.pool == "token":
      x = self.norm(tokens[:, 0])
    elif self.pool == "mean":
      x = self.norm(tokens[:, int(self.has_class_token) :].mean(axis=1))
    else:
      x = self.norm(tokens)
    if self.proj is not None:
      x = self.proj(x)
    return x.astype(jnp.float32)

  def __call__(
    self, video: jax.Array, *, deterministic: bool = True, rngs=None
  ) -> jax.Array:
    """float[B, T, H, W, 3] normalised video -> see `head`.

    In training (`deterministic=False`) with `mask_ratio` > 0 the blocks
    see the class token and the kept patch tokens only (`drop_tokens`).
    """
    tokens = self.embed(video)
    if not deterministic and self.mask_ratio > 0:
      tokens = self.drop_tokens(tokens, rngs)
    tokens = self.prepend_class_token(tokens)
    tokens = self.encode_tokens(tokens, deterministic=deterministic, rngs=rngs)
    return self.head(tokens)
