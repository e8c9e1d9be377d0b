"""On-device augmentations for uint8 video batches.

The input pipeline ships `uint8` frames; everything that turns them into model
inputs runs here, inside `jit`, on the (possibly sharded) global batch. No
function reads values back to the host, so they compose into a train step.

Batches are dicts:
  'video':  uint8[B, T, H, W, 3], RGB.
  'tokens': int32[B, 77] (video-text), or integer labels such as
            'label': int32[B] or 'verb'/'noun'/'action': int32[B] (EK-100).

Randomness comes from a key derived from the step, e.g.
`jax.random.fold_in(base_key, step)`, so a resumed run augments the same way.
With the default partitionable threefry, random draws are generated shard by
shard, so results do not depend on how the batch is sharded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from vidjax.augment import randaugment, views
from vidjax.config import defaults

Array = jax.Array

# The keys a task gives `make_augment` (from the model), with their defaults.
_TASK_KEYS = dict(
  dtype="float32",
  num_classes=None,
  mask_ratio=0.0,
  tubelet=2,
  patch=16,
  repeats=1,
  views=None,
)


def normalize(
  video: Array,
  mean: Sequence[float] = defaults.CLIP_MEAN,
  std: Sequence[float] = defaults.CLIP_STD,
  dtype=jnp.float32,
) -> Array:
  """Maps pixels on the 0-255 scale to `(x / 255 - mean) / std`.

  Args:
    video: uint8[..., 3] (or float on the 0-255 scale, e.g. after mixup).
    mean: per-channel mean on the 0-1 scale.
    std: per-channel std on the 0-1 scale.
    dtype: output dtype (float32 or bfloat16).

  Returns:
    dtype[..., 3], same shape as `video`.
  """
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)
  # One fused multiply-add in float32, then cast: bf16 output keeps accuracy.
  scale = 1.0 / (255.0 * std)
  out = video.astype(jnp.float32) * scale - mean / std
  return out.astype(dtype)


def smooth_one_hot(
  labels: Array, num_classes: int, smoothing: float = 0.0
) -> Array:
  """One-hot targets with label smoothing, as timm: off = s / C, on = 1 - s + off.

  Args:
    labels: int[B].
    num_classes: C.
    smoothing: s in [0, 1).

  Returns:
    float32[B, C], rows sum to 1.
  """
  return optax.smooth_labels(
    jax.nn.one_hot(labels, num_classes, dtype=jnp.float32), smoothing
  )


def mix_partner(x: Array, groups: int = 1) -> Array:
  """Each example's mixing partner: the batch reversed within `groups` slices.

  timm pairs example i with B-1-i (`x.flip(0)`). With `groups` equal to the
  number of data shards, each shard is reversed on its own, so mixing moves no
  data between devices (timm's per-GPU behaviour).

  Args:
    x: [B, ...].
    groups: number of equal contiguous slices of the batch; must divide B.

  Returns:
    [B, ...] partners.
  """
  batch = x.shape[0]
  if batch % groups:
    raise ValueError(
      f"augment: batch size {batch} is not divisible by mix_groups={groups}"
    )
  grouped = x.reshape((groups, batch // groups) + x.shape[1:])
  return grouped[:, ::-1].reshape(x.shape)


def sample_mix_params(
  key: Array,
  height: int,
  width: int,
  *,
  mixup_alpha: float = 0.8,
  cutmix_alpha: float = 1.0,
  switch_prob: float = 0.5,
  mix_prob: float = 1.0,
) -> tuple[Array, Array]:
  """Draws one mixup-or-cutmix choice for the whole batch (timm's 'batch' mode).

  With both alphas > 0, cutmix is used with probability `switch_prob`. Cutmix
  draws lam ~ Beta(cutmix_alpha), a box of side `int(side * sqrt(1 - lam))`
  centred uniformly (clipped at the borders), then corrects lam to the kept
  area. Mixing happens at all with probability `mix_prob`; otherwise lam = 1.

  Args:
    key: PRNG key.
    height, width: frame size H, W.
    mixup_alpha, cutmix_alpha: Beta parameters; 0 disables that mode.
    switch_prob: probability of cutmix when both are enabled.
    mix_prob: probability of mixing the batch at all.

  Returns:
    (lam, keep): float32[] weight of each example's own labels, and
    float32[H, W] weight of its own pixels (lam everywhere for mixup, 0 inside
    the box and 1 outside for cutmix).
  """
  if mixup_alpha <= 0 and cutmix_alpha <= 0:
    raise ValueError(
      "augment: mixup_alpha and cutmix_alpha are both 0; nothing to mix"
    )
  k_apply, k_switch, k_beta, k_cy, k_cx = jax.random.split(key, 5)
  if mixup_alpha > 0 and cutmix_alpha > 0:
    use_cutmix = jax.random.uniform(k_switch) < switch_prob
  else:
    use_cutmix = jnp.asarray(cutmix_alpha > 0)
  # Beta(a, a) = G1 / (G1 + G2) for Gamma(a) draws, taken in log space (stable
  # for small a) and in one vectorised call (the gamma sampler is slow to compile).
  alphas = jnp.array(
    [mixup_alpha if mixup_alpha > 0 else 1.0] * 2
    + [cutmix_alpha if cutmix_alpha > 0 else 1.0] * 2,
    jnp.float32,
  )
  log_g = jax.random.loggamma(k_beta, alphas)
  lam_mixup = jax.nn.sigmoid(log_g[0] - log_g[1]) if mixup_alpha > 0 else 1.0
  lam_cut = jax.nn.sigmoid(log_g[2] - log_g[3]) if cutmix_alpha > 0 else 1.0

  # Cutmix box as in timm's rand_bbox: half-sides are cut // 2.
  ratio = jnp.sqrt(1.0 - lam_cut)
  cut_h = jnp.floor(height * ratio).astype(jnp.int32)
  cut_w = jnp.floor(width * ratio).astype(jnp.int32)
  cy = jax.random.randint(k_cy, (), 0, height)
  cx = jax.random.randint(k_cx, (), 0, width)
  y0, y1 = (
    jnp.clip(cy - cut_h // 2, 0, height),
    jnp.clip(cy + cut_h // 2, 0, height),
  )
  x0, x1 = (
    jnp.clip(cx - cut_w // 2, 0, width),
    jnp.clip(cx + cut_w // 2, 0, width),
  )
  ys, xs = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  in_box = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
  lam_box = 1.0 - ((y1 - y0) * (x1 - x0)).astype(jnp.float32) / (height * width)

  apply = jax.random.uniform(k_apply) < mix_prob
  lam = jnp.where(use_cutmix, lam_box, lam_mixup)
  lam = jnp.where(apply, lam, 1.0).astype(jnp.float32)
  keep = jnp.where(use_cutmix, (~in_box).astype(jnp.float32), lam_mixup)
  keep = jnp.where(apply, keep, 1.0).astype(jnp.float32)
  return lam, keep


def mixup_cutmix(
  video: Array,
  labels: Mapping[str, Array],
  num_classes: Mapping[str, int],
  key: Array,
  *,
  mixup_alpha: float = 0.8,
  cutmix_alpha: float = 1.0,
  switch_prob: float = 0.5,
  mix_prob: float = 1.0,
  label_smoothing: float = 0.1,
  groups: int = 1,
  valid: Array | None = None,
) -> tuple[Array, dict[str, Array], Array]:
  """Mixup/cutmix of a video batch and its soft targets, one lam per batch.

  Every label head (e.g. verb and noun) is mixed with the same partner and lam.
  The cutmix box covers the same pixels in all frames.

  Args:
    video: [B, T, H, W, C], uint8 or float on the 0-255 scale.
    labels: head name -> int[B].
    num_classes: head name -> number of classes (one entry per head in labels).
    key: PRNG key.
    mixup_alpha, cutmix_alpha, switch_prob, mix_prob: see `sample_mix_params`.
    label_smoothing: timm-style smoothing applied before mixing.
    groups: see `mix_partner`.
    valid: optional bool[B]; an example whose partner is invalid (a clip
      that could not be read) is left unmixed.

  Returns:
    (video, targets, lam): float32[B, T, H, W, C] on the input's scale,
    head name -> float32[B, num_classes[head]] (rows sum to 1), float32[] lam.
  """
  lam, keep = sample_mix_params(
    key,
    video.shape[2],
    video.shape[3],
    mixup_alpha=mixup_alpha,
    cutmix_alpha=cutmix_alpha,
    switch_prob=switch_prob,
    mix_prob=mix_prob,
  )
  own = video.astype(jnp.float32)
  # The partner is gathered in the input dtype: uint8 moves 4x fewer bytes.
  other = mix_partner(video, groups).astype(jnp.float32)
  keep = keep[None, None, :, :, None]
  own_lam = lam
  if valid is not None:
    partner_ok = mix_partner(valid.astype(bool), groups)
    keep = jnp.where(partner_ok[:, None, None, None, None], keep, 1.0)
    own_lam = jnp.where(partner_ok, lam, 1.0)[:, None]
  mixed = keep * own + (1.0 - keep) * other
  targets = {}
  for name, label in labels.items():
    if name not in num_classes:
      raise KeyError(f"augment: no num_classes entry for label head {name!r}")
    y = smooth_one_hot(label, num_classes[name], label_smoothing)
    targets[name] = own_lam * y + (1.0 - own_lam) * mix_partner(y, groups)
  return mixed, targets, lam


def tube_mask(
  key: Array,
  batch_size: int,
  num_frames: int,
  height: int,
  width: int,
  *,
  ratio: float = 0.9,
  tubelet: int = 2,
  patch: int = 16,
) -> Array:
  """VideoMAE tube masking: one random spatial mask repeated over time.

  Each example masks exactly `floor(ratio * S)` of its S = (H/p)(W/p) spatial
  positions, so all examples have the same number of masked tokens (the
  encoder can gather the visible ones into a dense [B, N_visible, D]).

  Token order is time-major, matching a patch embedding flattened from
  [B, T/t, H/p, W/p, D]: index = ti * S + hi * (W/p) + wi.

  Args:
    key: PRNG key.
    batch_size, num_frames, height, width: B, T, H, W of the video.
    ratio: fraction of spatial positions masked.
    tubelet: frames per token t.
    patch: pixels per token side p.

  Returns:
    bool[B, N], N = (T/t)(H/p)(W/p); True means masked (hidden from the encoder).
  """
  if num_frames % tubelet or height % patch or width % patch:
    raise ValueError(
      f"augment: video of {num_frames} frames x {height}x{width} does not split into "
      f"tubelet={tubelet} x patch={patch} tokens"
    )
  spatial = (height // patch) * (width // patch)
  num_masked = int(ratio * spatial)
  noise = jax.random.uniform(key, (batch_size, spatial))
  # Rank of each position in a random order; the first num_masked are masked.
  ranks = jnp.argsort(jnp.argsort(noise, axis=1), axis=1)
  mask = ranks < num_masked
  return jnp.tile(mask, (1, num_frames // tubelet))


def make_augment(
  config,
) -> Callable[[dict[str, Array], Array], dict[str, Array]]:
  """Builds `fn(batch, key) -> batch` composing the augmentations for a task.

  Config keys (a ConfigDict or dict; missing keys take the defaults of
  `vidjax.config.defaults.augment_config` and, for the task's keys, those below):
    mean, std: normalisation on the 0-1 scale (default CLIP's).
    dtype: output video dtype, 'float32' (default) or 'bfloat16'.
    mixup_alpha, cutmix_alpha: Beta parameters (default 0 = no mixing; timm's
      recipe is 0.8 and 1.0).
    switch_prob (0.5), mix_prob (1.0): see `sample_mix_params`.
    label_smoothing: default 0.0.
    num_classes: int (for 'label') or {head: int}, e.g. {'verb': 97,
      'noun': 300}. Heads listed here get soft targets.
    mix_groups: see `mix_partner` (default 1 = whole batch, as timm).
    mask_ratio: VideoMAE tube-mask ratio (default 0 = no mask).
    tubelet (2), patch (16): token size for the mask.
    repeats (1 = off), views: R views of each clip of the batch (canvases),
      each cropped, flipped and resized on its own first (`vidjax.augment.views`;
      `views` holds `crop`, `crop_scale`, `hflip`, `size`); every other
      augmentation then draws per view.
    randaugment_layers (0 = off), randaugment_magnitude, randaugment_prob,
    randaugment_std, erase_prob (0 = off), erase_mode: RandAugment and
      random erasing per clip, before mixing (`vidjax.augment.randaugment`).

  The returned batch has 'video' normalised (dtype[B, T, H, W, 3]; B times
  `repeats` rows with repeats), every other input entry unchanged (repeated
  alike), plus:
    '<head>_target': float32[B, C] soft targets for each head in num_classes,
      when mixing or label smoothing is on;
    'mask': bool[B, N] when mask_ratio > 0.
  Pure and jit-compatible; works on batches sharded over a mesh.
  """
  config = {**defaults.augment_config(), **_TASK_KEYS, **dict(config)}
  mean, std = tuple(config["mean"]), tuple(config["std"])
  dtype = jnp.dtype(config["dtype"])
  mixup_alpha = float(config["mixup_alpha"])
  cutmix_alpha = float(config["cutmix_alpha"])
  mix = mixup_alpha > 0 or cutmix_alpha > 0
  switch_prob, mix_prob = (
    float(config["switch_prob"]),
    float(config["mix_prob"]),
  )
  smoothing = float(config["label_smoothing"])
  mix_groups = int(config["mix_groups"])
  num_classes = config["num_classes"]
  if isinstance(num_classes, int):
    num_classes = {"label": num_classes}
  num_classes = dict(num_classes or {})
  if (mix or smoothing > 0) and not num_classes:
    raise ValueError(
      "augment: mixup/cutmix or label_smoothing needs config.num_classes"
    )
  mask_ratio = float(config["mask_ratio"])
  tubelet, patch = int(config["tubelet"]), int(config["patch"])
  clip_augment = randaugment.make_clip_augment(config, mean, std)
  repeats, view_spec = int(config["repeats"]), config["views"]

  def augment(batch: dict[str, Array], key: Array) -> dict[str, Array]:
    if "video" not in batch and "features" in batch:
      return dict(batch)  # A probe's cached features: the model's input.
    if "video" not in batch:
      raise KeyError(f"augment: batch has no 'video' (keys: {sorted(batch)})")
    if repeats > 1:  # A key of its own: the other draws stay as at R=1.
      batch = views.make_views(
        batch, jax.random.fold_in(key, 2), repeats, view_spec
      )
    out = dict(batch)
    k_mix, k_mask = jax.random.split(key)
    video = batch["video"]
    if clip_augment is not None:
      video = clip_augment(video, jax.random.fold_in(key, 1))
    if mix or smoothing > 0:
      missing = [name for name in num_classes if name not in batch]
      if missing:
        raise KeyError(
          f"augment: batch lacks label heads {missing} named in num_classes"
        )
      labels = {name: batch[name] for name in num_classes}
      if mix:
        video, targets, _ = mixup_cutmix(
          video,
          labels,
          num_classes,
          k_mix,
          mixup_alpha=mixup_alpha,
          cutmix_alpha=cutmix_alpha,
          switch_prob=switch_prob,
          mix_prob=mix_prob,
          label_smoothing=smoothing,
          groups=mix_groups,
          valid=batch.get("valid"),
        )
      else:
        targets = {
          name: smooth_one_hot(labels[name], num_classes[name], smoothing)
          for name in labels
        }
      out.update({f"{name}_target": t for name, t in targets.items()})
    out["video"] = normalize(video, mean, std, dtype)
    if mask_ratio > 0:
      b, t, h, w, _ = video.shape
      out["mask"] = tube_mask(
        k_mask, b, t, h, w, ratio=mask_ratio, tubelet=tubelet, patch=patch
      )
    return out

  return augment
