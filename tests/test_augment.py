"""Tests for vidjax.augment: values, randomness contracts, jit and sharding."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from vidjax import augment
from vidjax.config import defaults


def _video(b=4, t=4, h=32, w=32, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(0, 256, (b, t, h, w, 3), dtype=np.uint8))


def test_normalize_values_and_dtype():
  video = _video(b=2, t=2, h=4, w=4)
  out = augment.normalize(video, defaults.CLIP_MEAN, defaults.CLIP_STD)
  assert out.dtype == jnp.float32 and out.shape == video.shape
  expected = (
    np.asarray(video, np.float64) / 255.0 - np.array(defaults.CLIP_MEAN)
  ) / np.array(defaults.CLIP_STD)
  np.testing.assert_allclose(out, expected, atol=1e-5)
  bf16 = augment.normalize(
    video, defaults.IMAGENET_MEAN, defaults.IMAGENET_STD, jnp.bfloat16
  )
  assert bf16.dtype == jnp.bfloat16


def test_smooth_one_hot_is_timms_label_smoothing():
  """optax's smooth_labels, as timm smooths: off = s / C, on = 1 - s + off."""
  y = augment.smooth_one_hot(jnp.array([2, 0]), 5, 0.1)
  np.testing.assert_allclose(y[0], [0.02, 0.02, 0.92, 0.02, 0.02], atol=1e-7)
  np.testing.assert_allclose(y[1], [0.92, 0.02, 0.02, 0.02, 0.02], atol=1e-7)
  np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("alphas", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_cutmix_targets_and_pixels(alphas):
  mixup_alpha, cutmix_alpha = alphas
  b, h, w = 8, 16, 24
  # Example i is the constant image i, so each pixel says where it came from.
  video = jnp.broadcast_to(
    jnp.arange(b, dtype=jnp.uint8)[:, None, None, None, None], (b, 2, h, w, 3)
  )
  labels = {"verb": jnp.arange(b) % 5, "noun": jnp.arange(b) % 7}
  mix = jax.jit(
    functools.partial(
      augment.mixup_cutmix,
      num_classes={"verb": 5, "noun": 7},
      mixup_alpha=mixup_alpha,
      cutmix_alpha=cutmix_alpha,
      label_smoothing=0.1,
    )
  )
  for seed in range(4):
    key = jax.random.key(seed)
    mixed, targets, lam = mix(video, labels, key=key)
    lam = float(lam)
    mixed = np.asarray(mixed)
    own = np.arange(b, dtype=np.float32)[:, None, None, None, None]
    partner = own[::-1]
    # Every pixel is lam*own + (1-lam)*partner (mixup) or exactly one of them (cutmix);
    # either way the fraction of own signal equals the label weight lam.
    with np.errstate(invalid="ignore", divide="ignore"):
      own_weight = (mixed - partner) / (own - partner)
    own_weight = own_weight[own[:, 0, 0, 0, 0] != partner[:, 0, 0, 0, 0]]
    np.testing.assert_allclose(
      own_weight.mean(axis=(1, 2, 3, 4)), lam, atol=1e-5
    )
    if mixup_alpha == 0:  # Cutmix: the same box in every frame.
      assert set(np.unique(own_weight)) <= {0.0, 1.0}
      np.testing.assert_array_equal(mixed[:, 0], mixed[:, 1])
    for name, c in (("verb", 5), ("noun", 7)):
      t = np.asarray(targets[name])
      assert t.shape == (b, c) and t.dtype == np.float32
      np.testing.assert_allclose(t.sum(-1), 1.0, atol=1e-6)
      y = np.asarray(augment.smooth_one_hot(labels[name], c, 0.1))
      np.testing.assert_allclose(t, lam * y + (1 - lam) * y[::-1], atol=1e-6)
  np.testing.assert_array_equal(
    mix(video, labels, key=key)[0], mixed
  )  # Same key, same mix.


def test_mixing_leaves_out_invalid_partners():
  """An unreadable clip (valid=False) mixes into nobody's pixels or targets."""
  b = 6
  video = jnp.broadcast_to(
    jnp.arange(1, b + 1, dtype=jnp.uint8)[:, None, None, None, None],
    (b, 2, 8, 8, 3),
  )
  labels = {"label": jnp.arange(b) % 4}
  valid = jnp.array([True, True, False, True, True, True])  # 2 is 3's partner.
  mixed, targets, lam = jax.jit(
    functools.partial(
      augment.mixup_cutmix,
      num_classes={"label": 4},
      mixup_alpha=0.8,
      cutmix_alpha=0.0,
      label_smoothing=0.1,
    )
  )(video, labels, key=jax.random.key(1), valid=valid)
  assert 0 < float(lam) < 1
  y = np.asarray(augment.smooth_one_hot(labels["label"], 4, 0.1))
  np.testing.assert_array_equal(mixed[3], video[3])
  np.testing.assert_allclose(targets["label"][3], y[3], atol=1e-6)
  np.testing.assert_allclose(
    targets["label"][1], lam * y[1] + (1 - lam) * y[4], atol=1e-6
  )
  assert not np.allclose(mixed[1], video[1])


@pytest.fixture(scope="module")
def mix_params():
  """(lam, keep) for 4000 keys on 10x14 frames, drawn with timm's default recipe."""
  keys = jax.random.split(jax.random.key(0), 4000)
  sample = jax.jit(
    jax.vmap(
      lambda k: augment.sample_mix_params(
        k, 10, 14, mixup_alpha=0.8, cutmix_alpha=1.0
      )
    )
  )
  lam, keep = sample(keys)
  return np.asarray(lam), np.asarray(keep)


def _is_cutmix(keep):
  return (keep == 0).any((1, 2)) | (keep == 1).all((1, 2))


def test_mix_lambda_distribution(mix_params):
  """Mixup's lam follows Beta(0.8, 0.8); cutmix is chosen about switch_prob of the time."""
  lam, keep = mix_params
  is_cutmix = _is_cutmix(keep)
  assert 0.45 < is_cutmix.mean() < 0.55
  lam_mixup = lam[~is_cutmix]
  assert abs(lam_mixup.mean() - 0.5) < 0.02
  assert abs(lam_mixup.var() - 0.8 * 0.8 / (1.6**2 * 2.6)) < 0.01
  np.testing.assert_array_equal(
    keep[~is_cutmix],
    np.broadcast_to(lam_mixup[:, None, None], keep[~is_cutmix].shape),
  )


def test_cutmix_lam_is_area_corrected(mix_params):
  lam, keep = mix_params
  cut = _is_cutmix(keep)
  lam, keep = lam[cut][:200], keep[cut][:200]
  # lam is exactly the kept fraction of the frame.
  np.testing.assert_allclose(lam, keep.mean((1, 2)), atol=1e-6)
  for k in keep:
    assert set(np.unique(k)) <= {0.0, 1.0}
    box = np.argwhere(k == 0)
    if len(box):  # The cut region is one rectangle.
      (y0, x0), (y1, x1) = box.min(0), box.max(0)
      assert (k[y0 : y1 + 1, x0 : x1 + 1] == 0).all()


def test_mix_groups_stay_within_groups():
  x = jnp.arange(8)
  np.testing.assert_array_equal(augment.mix_partner(x, 1), np.arange(8)[::-1])
  np.testing.assert_array_equal(
    augment.mix_partner(x, 2), [3, 2, 1, 0, 7, 6, 5, 4]
  )
  with pytest.raises(ValueError, match="mix_groups"):
    augment.mix_partner(x, 3)


def test_tube_mask_counts_and_structure():
  b, t, h, w, tubelet, patch = 5, 8, 64, 48, 2, 16
  mask = np.asarray(
    augment.tube_mask(
      jax.random.key(1), b, t, h, w, ratio=0.9, tubelet=tubelet, patch=patch
    )
  )
  spatial = (h // patch) * (w // patch)
  assert mask.shape == (b, (t // tubelet) * spatial) and mask.dtype == bool
  per_time = mask.reshape(b, t // tubelet, spatial)
  assert (
    per_time == per_time[:, :1]
  ).all()  # A tube: same positions at every time.
  np.testing.assert_array_equal(per_time[:, 0].sum(-1), int(0.9 * spatial))
  assert (
    len({row.tobytes() for row in per_time[:, 0]}) > 1
  )  # Differs between examples.
  with pytest.raises(ValueError, match="tubelet"):
    augment.tube_mask(jax.random.key(1), b, 7, h, w)


CONFIG = dict(
  mixup_alpha=0.8,
  cutmix_alpha=1.0,
  label_smoothing=0.1,
  num_classes={"verb": 5, "noun": 7},
  mask_ratio=0.75,
  tubelet=2,
  patch=8,
)


def _batch(b=8):
  return {
    "video": _video(b=b, t=4, h=16, w=16),
    "verb": jnp.arange(b, dtype=jnp.int32) % 5,
    "noun": jnp.arange(b, dtype=jnp.int32) % 7,
  }


@pytest.fixture(scope="module")
def eager_run():
  """One eager run of the composed function, shared by the jit and sharding tests."""
  fn = augment.make_augment(CONFIG)
  batch, key = _batch(), jax.random.fold_in(jax.random.key(0), 3)
  return fn, batch, key, fn(batch, key)


def test_make_augment_jits_and_matches_eager(eager_run):
  fn, batch, key, eager = eager_run
  compiled = jax.jit(fn).lower(batch, key).compile()
  jitted = compiled(batch, key)
  assert set(jitted) == {
    "video",
    "verb",
    "noun",
    "verb_target",
    "noun_target",
    "mask",
  }
  assert jitted["video"].dtype == jnp.float32 and jitted[
    "verb_target"
  ].shape == (8, 5)
  assert jitted["mask"].shape == (8, 2 * 4)
  for k in eager:
    np.testing.assert_allclose(jitted[k], eager[k], atol=1e-5)
  other = compiled(batch, jax.random.fold_in(jax.random.key(0), 4))
  assert not np.allclose(other["video"], jitted["video"])


def test_make_augment_label_smoothing_only_and_validation():
  fn = augment.make_augment({"label_smoothing": 0.1, "num_classes": 5})
  out = fn(
    {"video": _video(b=2), "label": jnp.array([1, 3])}, jax.random.key(0)
  )
  np.testing.assert_allclose(
    out["label_target"][0], [0.02, 0.92, 0.02, 0.02, 0.02], atol=1e-6
  )
  with pytest.raises(ValueError, match="num_classes"):
    augment.make_augment({"mixup_alpha": 0.8})
  with pytest.raises(KeyError, match="noun"):
    augment.make_augment(CONFIG)(
      {"video": _video(), "verb": jnp.zeros(4, jnp.int32)}, jax.random.key(0)
    )


def test_make_augment_on_sharded_batch(eager_run):
  fn, batch, key, eager = eager_run
  assert jax.device_count() == 8
  mesh = jax.make_mesh(
    (8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
  )
  sharding = NamedSharding(mesh, P("data"))
  out = jax.jit(fn)(jax.device_put(batch, sharding), key)
  assert out["video"].sharding.is_equivalent_to(sharding, 5)
  for k in out:  # Same numbers whether or not the batch is sharded.
    np.testing.assert_allclose(out[k], eager[k], atol=1e-5)
