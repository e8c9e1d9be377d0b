"""Masked alignment to a frozen CLIP teacher: Unmasked Teacher (UMT).

UMT (Li et al., ICCV 2023, arXiv 2303.16058) pretrains a video ViT by
aligning it to a frozen image CLIP instead of reconstructing pixels:

1. The teacher (`Teacher`: a CLIP vision tower, one frame at a time, at
   its own resolution: the student's token grid times its patch) returns
   the outputs of its last K blocks, each through its final LayerNorm and
   projection and L2-normalised, and its last block's class-token
   attention over the frame's patches (the heads' mean).
2. Each frame keeps `1 - mask_ratio` of its patches (`select_tokens`):
   UMT draws them without replacement in proportion to that attention
   (`'attention'`), or the most attended ones (`'topk'`), or any
   (`'random'`).
3. The student (`UMT`: a VideoMAE-style ViT) runs its blocks on the kept
   tokens only; the outputs of its last K blocks go through its final
   LayerNorm, get a fixed sinusoid position table added, and one head per
   layer (a linear map to the teacher's width, a LayerNorm, L2
   normalisation) each; `vidjax.tasks.distill` aligns them to the
   teacher's features of the same tokens.

With tubelets of t > 1 frames, a token's teacher features and attention
are the mean over its t frames (the features normalised again). The
teacher's weights are `Frozen` variables: no optimizer sees them, a run
keeps them in the model state it never trains (`rest`) and never saves
them; `vidjax.checkpoints.teacher` loads them and names their source.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from vidjax.models.vit import VisionTransformer, sincos_table


class Frozen(nnx.Variable):
  """Weights that never train (a teacher's): not an `nnx.Param`, so the
  optimizer, the gradients and the checkpoints' trained state leave them
  out."""


def freeze(module: nnx.Module) -> nnx.Module:
  """Turns every `nnx.Param` of `module` into a `Frozen`, in place."""
  for _, node in list(nnx.iter_graph(module)):
    if isinstance(node, nnx.Module):
      for name, value in list(vars(node).items()):
        if isinstance(value, nnx.Param):
          setattr(node, name, Frozen(value.get_value()))
  return module


def l2_normalize(x: jax.Array) -> jax.Array:
  """x / ||x|| along the last axis (PyTorch's `x / x.norm(dim=-1)`)."""
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def kept_per_frame(patches: int, mask_ratio: float) -> int:
  """Patches a frame keeps: N - int(N x mask_ratio), as UMT counts."""
  return patches - int(patches * mask_ratio)


def select_tokens(
  attention: jax.Array, noise: jax.Array, keep: int, how: str
) -> jax.Array:
  """The patch tokens each frame keeps.

  'attention' is UMT's `torch.multinomial(attention, N)` (N draws without
  replacement, in proportion to the weights) cut to its first `keep`: a
  draw without replacement is the order of `noise / attention` for
  exponential noise (Efraimidis and Spirakis's race), so the kept tokens
  are the `keep` smallest of those (the largest of log(attention) -
  log(noise)). 'topk' keeps the most attended, 'random' the smallest noise.

  Args:
    attention: float[B, T, N] class-token attention per frame (T token
      frames of N patches; non-negative, rows need not sum to one).
    noise: float[B, T, N] standard exponential draws (the random draw).
    keep: patches kept per frame.
    how: 'attention', 'topk' or 'random' (`defaults.SELECTIONS`).

  Returns:
    int32[B, T x keep]: token ids in (time, row, column) order, increasing
    along each row.
  """
  attention = attention.astype(jnp.float32)
  noise = noise.astype(jnp.float32)
  scores = {
    "attention": lambda: jnp.log(attention) - jnp.log(noise),
    "topk": lambda: attention,
    "random": lambda: -noise,
  }[how]()
  batch, frames, patches = attention.shape
  _, ids = jax.lax.top_k(scores, keep)
  ids = ids + patches * jnp.arange(frames)[None, :, None]
  return jnp.sort(ids.reshape(batch, frames * keep), axis=1).astype(jnp.int32)


def _class_attention(block, x: jax.Array) -> jax.Array:
  """The class token's attention weights in `block` over its input `x`
  [B, 1 + N, D], the heads' mean: float32[B, 1 + N] (PyTorch's
  `need_weights=True` average)."""
  attn = block.attn
  batch, length, width = x.shape
  qkv = attn.qkv(block.norm1(x)).reshape(batch, length, 3, attn.heads, -1)
  query, key = qkv[:, :1, 0], qkv[:, :, 1]  # [B, 1, h, d], [B, L, h, d]
  logits = jnp.einsum(
    "bqhd,bkhd->bhqk",
    query.astype(jnp.float32),
    key.astype(jnp.float32),
  ) / jnp.sqrt(jnp.float32(query.shape[-1]))
  return jax.nn.softmax(logits, axis=-1)[:, :, 0].mean(axis=1)


class Teacher(nnx.Module):
  """A frozen CLIP vision tower applied per frame (`tower`, a
  `VisionTransformer` of one frame, CLIP style, pool 'none', with its
  projection), its weights `Frozen`."""

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the tower a `spec.Vision` (one frame) describes, frozen."""
    self.tower = freeze(VisionTransformer(spec, rngs=rngs))

  def __call__(
    self, video: jax.Array, *, layers: int, tubelet: int = 1
  ) -> tuple[jax.Array, jax.Array]:
    """Features and attention of every frame, without gradients.

    Args:
      video: float[B, T, H, W, 3], normalised; resized (bicubic) to the
        tower's image size where it differs.
      layers: K, the last blocks returned.
      tubelet: frames per student token (t): features and attention are
        averaged over each tubelet's frames.

    Returns:
      (features float32[K, B, (T/t) x N, E], L2-normalised, tokens in (time,
      row, column) order; attention float32[B, T/t, N], the last block's
      class token over the N patches of each frame).
    """
    tower = self.tower
    batch, frames = video.shape[:2]
    x = video.reshape((batch * frames, 1) + video.shape[2:])
    if tuple(x.shape[2:4]) != tower.image_size:
      shape = (batch * frames, 1) + tower.image_size + (x.shape[-1],)
      x = jax.image.resize(x.astype(jnp.float32), shape, "cubic")
    tokens = tower.prepend_class_token(tower.embed(x))
    if tower.pre_norm is not None:
      tokens = tower.pre_norm(tokens)
    depth = tower.blocks.depth
    hidden = tower.blocks(tokens, outputs=depth)  # [depth, BT, 1 + N, D]
    last_input = hidden[-2] if depth > 1 else tokens
    attention = _class_attention(tower.blocks.layers[-1], last_input)[:, 1:]
    features = tower.head(hidden[-layers:])[:, :, 1:]  # [K, BT, N, E]
    patches = features.shape[2]
    features = features.reshape(
      layers, batch, frames // tubelet, tubelet, patches, -1
    ).mean(axis=3)
    attention = attention.reshape(
      batch, frames // tubelet, tubelet, patches
    ).mean(axis=2)
    features = l2_normalize(features).reshape(
      layers, batch, -1, features.shape[-1]
    )
    return jax.lax.stop_gradient((features, attention))


class AlignHead(nnx.Module):
  """UMT's per-layer head: Linear(D -> E), LayerNorm(E), L2 normalisation."""

  def __init__(self, width: int, out: int, *, eps: float, dtype, rngs):
    self.proj = nnx.Linear(
      width,
      out,
      dtype=dtype,
      kernel_init=nnx.initializers.xavier_uniform(),
      rngs=rngs,
    )
    self.norm = nnx.LayerNorm(out, epsilon=eps, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return l2_normalize(self.norm(self.proj(x)).astype(jnp.float32))


class UMT(nnx.Module):
  """The student, its alignment heads, and the frozen teacher.

  Parameters: `encoder` (a VisionTransformer, VideoMAE style, pool
  'none'), `align` (K `AlignHead`s, the last aligned layer last); the
  teacher's (`teacher.tower`) are `Frozen`. Built from a `spec.UMTSpec`.
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    """Builds the model a `spec.UMTSpec` describes."""
    encoder, teacher = spec.encoder, spec.teacher
    if encoder.grid[1:] != teacher.grid[1:]:
      raise ValueError(
        f"the teacher's patch grid {teacher.grid[1:]} is not the "
        f"student's {encoder.grid[1:]}"
      )
    layers = spec.align_layers
    if not 0 < layers <= min(encoder.blocks.depth, teacher.blocks.depth):
      raise ValueError(
        f"align_layers={layers}: the student has {encoder.blocks.depth} "
        f"blocks and the teacher {teacher.blocks.depth}"
      )
    self.spec = spec
    self.encoder = VisionTransformer(encoder, rngs=rngs)
    self.align = nnx.List(
      [
        AlignHead(
          encoder.blocks.width,
          teacher.output_dim,
          eps=encoder.blocks.ln_eps,
          dtype=encoder.blocks.compute.dtype,
          rngs=rngs,
        )
        for _ in range(layers)
      ]
    )
    self.teacher = Teacher(teacher, rngs=rngs)

  @property
  def num_kept(self) -> int:
    """Tokens a clip keeps: `kept_per_frame` x (T/t)."""
    time, rows, columns = self.encoder.grid
    return time * kept_per_frame(rows * columns, self.spec.mask_ratio)

  def teach(self, video: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The teacher's targets and attention (`Teacher.__call__`)."""
    return self.teacher(
      video, layers=self.spec.align_layers, tubelet=self.encoder.tubelet
    )

  def kept_token_ids(self, attention: jax.Array, key: jax.Array) -> jax.Array:
    """`select_tokens` of `spec.select` on the teacher's attention
    [B, T/t, N], with exponential noise from `key` -> int32[B, M]."""
    noise = jax.random.exponential(key, attention.shape, jnp.float32)
    _, rows, columns = self.encoder.grid
    keep = kept_per_frame(rows * columns, self.spec.mask_ratio)
    return select_tokens(attention, noise, keep, self.spec.select)

  def __call__(
    self,
    video: jax.Array,
    kept: jax.Array,
    *,
    deterministic: bool = True,
    rngs=None,
  ) -> jax.Array:
    """The student's aligned features of the kept tokens.

    Args:
      video: float[B, T, H, W, 3], normalised.
      kept: int32[B, M] token ids (`kept_token_ids`).
      deterministic: disables drop path when True.
      rngs: optional nnx.Rngs or key for drop path.

    Returns:
      float32[K, B, M, E], L2-normalised along E.
    """
    encoder = self.encoder
    tokens = jnp.take_along_axis(encoder.embed(video), kept[..., None], axis=1)
    if encoder.pre_norm is not None:
      tokens = encoder.pre_norm(tokens)
    hidden = encoder.blocks(
      tokens,
      deterministic=deterministic,
      rngs=rngs,
      outputs=self.spec.align_layers,
    )
    hidden = encoder.norm(hidden).astype(jnp.float32)  # [K, B, M, D]
    positions = jnp.asarray(sincos_table(encoder.num_patches, encoder.width))
    hidden = hidden + positions[kept][None]
    return jnp.stack([head(x) for head, x in zip(self.align, hidden)])
