"""VideoMAE: loss on masked tubelets only, encoder on visible tokens only."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidjax.config.defaults import model_config
from vidjax.models import build_model, spec
from vidjax.models.videomae import (
  Classifier,
  VideoMAE,
  normalize_patches,
  patchify,
)
from vidjax.tasks import losses


def tiny_videomae(**overrides):
  keys = dict(
    variant="Ti/8",
    width=32,
    depth=2,
    heads=2,
    image_size=16,
    num_frames=4,
    tubelet=2,
    decoder=dict(width=16, depth=1, heads=2),
    mask_ratio=0.5,
    dtype="float32",
    attention="xla",
  )
  keys.update(overrides)
  return VideoMAE(spec.of("videomae", **keys), rngs=nnx.Rngs(0))


def tube_mask(batch=2, seed=0):
  """Masks 2 of the 4 patches per frame, the same ones in both time steps."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((batch, 2, 4), bool)
  for b in range(batch):
    mask[b, :, rng.permutation(4)[:2]] = True
  return jnp.asarray(mask.reshape(batch, 8))


def test_patchify_layout_and_per_patch_normalisation():
  video = jnp.arange(2 * 4 * 16 * 16 * 3, dtype=jnp.float32).reshape(
    2, 4, 16, 16, 3
  )
  patches = patchify(video, 2, 8)
  assert patches.shape == (2, 8, 2 * 8 * 8 * 3)
  # Token 1 is time step 0, row 0, column 1: frames 0-1, pixels 8-15.
  np.testing.assert_array_equal(
    patches[0, 1].reshape(2, 8, 8, 3), video[0, 0:2, 0:8, 8:16]
  )
  normed = normalize_patches(patches).reshape(2, 8, -1, 3)
  np.testing.assert_allclose(normed.mean(axis=2), 0, atol=1e-4)
  np.testing.assert_allclose(normed.std(axis=2, ddof=1), 1, atol=1e-3)


def test_loss_is_the_mse_on_masked_patches_and_ignores_their_pixels():
  model = tiny_videomae()
  mask = tube_mask()
  video = jax.random.normal(jax.random.key(1), (2, 4, 16, 16, 3))
  run = jax.jit(lambda v: model(v, mask, return_predictions=True))
  loss, predictions, targets = run(video)
  assert predictions.shape == targets.shape == (2, 4, 384)
  expected_targets = normalize_patches(
    patchify(video, 2, 8)[np.asarray(mask)].reshape(2, 4, -1)
  )
  np.testing.assert_allclose(targets, expected_targets, atol=1e-5)
  np.testing.assert_allclose(
    loss, np.mean((predictions - targets) ** 2), rtol=1e-5
  )
  # The task's per-example errors (padding dropped by `valid`) average to it.
  np.testing.assert_allclose(
    losses.reconstruction_error(predictions, targets).mean(), loss, rtol=1e-5
  )
  # The encoder sees visible tokens only: masked pixels cannot leak.
  noisy = patchify(video, 2, 8) + 5.0 * mask[..., None]
  noisy_video = (
    noisy.reshape(2, 2, 2, 2, 2, 8, 8, 3)
    .transpose(0, 1, 4, 2, 5, 3, 6, 7)
    .reshape(video.shape)
  )
  np.testing.assert_allclose(run(noisy_video)[1], predictions, atol=1e-5)


def test_wrong_mask_count_gives_nan_and_wrong_shape_raises():
  model = tiny_videomae()
  run = jax.jit(lambda video, mask: model(video, mask))  # As in training.
  video = jnp.zeros((2, 4, 16, 16, 3))
  mask = tube_mask().at[0, 0].set(~tube_mask()[0, 0])
  assert np.isnan(run(video, mask))
  with pytest.raises(ValueError, match="does not match"):
    run(video, jnp.zeros((2, 7), bool))


def test_classifier_backbones_and_build_model():
  video = jax.random.normal(jax.random.key(1), (2, 4, 16, 16, 3))
  for backbone, tubelet in (("videomae", 2), ("clip", 1)):
    keys = dict(
      num_classes=5,
      backbone=backbone,
      variant="Ti/8",
      width=32,
      depth=1,
      heads=2,
      image_size=16,
      num_frames=4,
      tubelet=tubelet,
      drop_path=0.0,
      head_dropout=0.5,
      dtype="float32",
      attention="xla",
    )
    model = Classifier(spec.of("classifier", **keys), rngs=nnx.Rngs(0))
    run = nnx.jit(
      lambda model, video, key: (
        model(video),
        model(video, deterministic=False, rngs=key),
      )
    )
    logits, dropped = run(model, video, jax.random.key(0))
    assert logits.shape == (2, 5) and logits.dtype == jnp.float32
    assert not np.allclose(dropped, logits)
  for name in ("clip", "videomae", "classifier"):
    config = model_config(name)
    config.update(variant="Ti/16", depth=1, num_frames=4, image_size=32)
    if name == "clip":
      config.text.update(layers=1, width=64, heads=1)
    model = nnx.eval_shape(
      lambda config=config: build_model(config, rngs=nnx.Rngs(0))
    )
    assert type(model).__name__.lower() == name
