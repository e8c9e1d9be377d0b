"""Tests for vidjax.tasks.losses against numpy/loop references."""

import jax
import jax.numpy as jnp
import numpy as np

from vidjax import sharding
from vidjax.config.defaults import INIT_LOGIT_SCALE
from vidjax.tasks import losses

# Jitted once per test: much faster than dozens of eager ops on 2 cores.
contrastive = jax.jit(losses.contrastive_loss, static_argnames="normalize")
cross_entropy = jax.jit(losses.softmax_cross_entropy)
ranking = jax.jit(losses.max_margin_ranking_loss, static_argnames="margin")


def _log_softmax(x, axis):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def _reference_contrastive(video, text, logit_scale):
  video = video / np.linalg.norm(video, axis=1, keepdims=True)
  text = text / np.linalg.norm(text, axis=1, keepdims=True)
  logits = np.exp(logit_scale) * video @ text.T
  idx = np.arange(len(video))
  v2t = -_log_softmax(logits, 1)[idx, idx].mean()
  t2v = -_log_softmax(logits.T, 1)[idx, idx].mean()
  return (v2t + t2v) / 2


def _embeddings(b=32, d=16, seed=0):
  rng = np.random.default_rng(seed)
  video = rng.normal(size=(b, d)).astype(np.float32)
  text = (video + 0.8 * rng.normal(size=(b, d))).astype(np.float32)
  return video, text


def test_contrastive_matches_numpy_reference():
  video, text = _embeddings()
  loss, metrics = contrastive(video, text, INIT_LOGIT_SCALE)
  ref = _reference_contrastive(video, text, INIT_LOGIT_SCALE)
  np.testing.assert_allclose(loss, ref, rtol=1e-5)
  assert 0.0 <= metrics["v2t_acc"] <= 1.0
  np.testing.assert_allclose(metrics["logit_scale"], 1 / 0.07, rtol=1e-5)


def test_contrastive_sharded_equals_global_batch_loss():
  mesh = sharding.make_mesh(fsdp=2)
  video, text = _embeddings(b=32)
  spec = sharding.batch_sharding(mesh)
  video_s, text_s = jax.device_put(video, spec), jax.device_put(text, spec)
  scale = jax.device_put(
    jnp.float32(INIT_LOGIT_SCALE), sharding.replicated(mesh)
  )

  loss, metrics = contrastive(video_s, text_s, scale)
  single, single_metrics = contrastive(video, text, INIT_LOGIT_SCALE)
  np.testing.assert_allclose(loss, single, rtol=1e-5)
  np.testing.assert_allclose(metrics["v2t_acc"], single_metrics["v2t_acc"])
  ref = _reference_contrastive(video, text, INIT_LOGIT_SCALE)
  np.testing.assert_allclose(loss, ref, rtol=1e-5)

  # Sanity: a per-device loss (negatives from the local 4 only) differs, so
  # the equality above really means all 32 embeddings were compared.
  local = np.mean(
    [
      _reference_contrastive(
        video[i : i + 4], text[i : i + 4], INIT_LOGIT_SCALE
      )
      for i in range(0, 32, 4)
    ]
  )
  assert abs(local - ref) > 1e-2

  # Gradients are global too: same as unsharded.
  grad = jax.jit(jax.grad(lambda v, t: contrastive(v, t, 2.0)[0]))
  np.testing.assert_allclose(
    grad(video_s, text_s), grad(video, text), rtol=1e-4, atol=1e-7
  )


def test_contrastive_without_normalization_uses_raw_dot_products():
  video, text = _embeddings(b=8)
  video /= np.linalg.norm(video, axis=1, keepdims=True)
  text /= np.linalg.norm(text, axis=1, keepdims=True)
  a, _ = contrastive(3 * video, 3 * text, 0.0, normalize=False)
  b, _ = contrastive(video, text, np.log(9.0), normalize=True)
  np.testing.assert_allclose(a, b, rtol=1e-5)


def test_l2_normalize_on_host_and_device():
  x = np.array([[3.0, 4.0], [0.0, 0.0]])
  host = losses.l2_normalize(x)
  assert isinstance(host, np.ndarray) and host.dtype == np.float64
  np.testing.assert_allclose(host, [[0.6, 0.8], [0.0, 0.0]])
  device = jax.jit(losses.l2_normalize)(jnp.asarray(x, jnp.bfloat16))
  assert device.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(device, np.float32), host, atol=1e-2)


def test_softmax_cross_entropy_hard_and_soft_targets():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 5)).astype(np.float32)
  labels = np.array([0, 3, 4, 1], np.int32)
  onehot = np.eye(5, dtype=np.float32)[labels]
  logp = _log_softmax(logits, 1)

  np.testing.assert_allclose(
    cross_entropy(logits, labels), -logp[np.arange(4), labels].mean(), rtol=1e-5
  )
  np.testing.assert_allclose(
    cross_entropy(logits, onehot), cross_entropy(logits, labels), rtol=1e-6
  )
  mixed = 0.7 * onehot + 0.3 * onehot[::-1]
  np.testing.assert_allclose(
    cross_entropy(logits, mixed), -(mixed * logp).sum(1).mean(), rtol=1e-5
  )


def _reference_ranking(x, margin):
  """Loop over AVION's terms: (x_ii vs x_ij) and (x_ii vs x_ji), i != j."""
  n = len(x)
  terms = []
  for i in range(n):
    for j in range(n):
      if i != j:
        terms.append(max(0.0, margin - (x[i, i] - x[i, j])))
        terms.append(max(0.0, margin - (x[i, i] - x[j, i])))
  return np.mean(terms)


def test_max_margin_ranking_loss_matches_loop():
  rng = np.random.default_rng(1)
  text, video = rng.normal(size=(2, 6, 8))
  text /= np.linalg.norm(text, axis=1, keepdims=True)
  video /= np.linalg.norm(video, axis=1, keepdims=True)
  sim = (text @ video.T).astype(np.float32)
  for margin in (0.2, 0.4):
    np.testing.assert_allclose(
      ranking(sim, margin=margin), _reference_ranking(sim, margin), rtol=1e-5
    )
  # Perfectly separated pairs cost nothing.
  assert float(ranking(np.eye(4, dtype=np.float32))) == 0.0


@jax.jit
def _every_loss_and_gradient(
  video, text, logits, targets, pred, patches, valid
):
  """{loss name: (value, (grad wrt input 0, grad wrt input 1))}: one compile."""
  scale = INIT_LOGIT_SCALE
  fns = {
    "contrastive": (
      lambda v, t: losses.contrastive_loss(v, t, scale, valid=valid)[0],
      (video, text),
    ),
    "ranking": (
      lambda v, t: losses.max_margin_ranking_loss(
        losses.l2_normalize(t) @ losses.l2_normalize(v).T, valid=valid
      ),
      (video, text),
    ),
    "cross_entropy": (
      lambda x, y: losses.softmax_cross_entropy(x, y, valid=valid),
      (logits, targets),
    ),
    "mae": (
      lambda p, t: losses.masked_mean(losses.reconstruction_error(p, t), valid),
      (pred, patches),
    ),
  }
  return {
    name: jax.value_and_grad(fn, argnums=(0, 1))(*args)
    for name, (fn, args) in fns.items()
  }


def test_invalid_elements_change_neither_loss_nor_gradient():
  """Each loss on a batch with invalid elements equals the loss on the valid
  ones alone, whatever the invalid ones hold, and so does its gradient."""
  rng = np.random.default_rng(3)
  b, d = 8, 16
  valid = np.array([1, 1, 0, 1, 1, 0, 1, 1], bool)
  video, text = _embeddings(b=b, d=d, seed=4)
  inputs = [
    video,
    text,
    rng.normal(size=(b, d)).astype(np.float32),
    np.eye(d, dtype=np.float32)[rng.integers(0, d, b)],
    rng.normal(size=(b, 3, 2)).astype(np.float32),  # 3 masked patches
    rng.normal(size=(b, 3, 2)).astype(np.float32),
  ]
  # Anything in the invalid rows: large noise, other labels.
  garbage = [
    np.where(
      valid.reshape((-1,) + (1,) * (x.ndim - 1)),
      x,
      (50 * rng.normal(size=x.shape)).astype(x.dtype)
      if x.dtype == np.float32
      else x,
    )
    for x in inputs
  ]
  got = _every_loss_and_gradient(*inputs, valid)
  noisy = _every_loss_and_gradient(*garbage, valid)
  alone = _every_loss_and_gradient(
    *[x[valid] for x in inputs], np.ones(valid.sum(), bool)
  )
  for name, (loss, grads) in got.items():
    np.testing.assert_allclose(loss, alone[name][0], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(noisy[name][0], loss, rtol=1e-5, err_msg=name)
    for g, g_noisy, g_alone in zip(grads, noisy[name][1], alone[name][1]):
      np.testing.assert_allclose(
        g[valid], g_alone, rtol=1e-4, atol=1e-7, err_msg=name
      )
      np.testing.assert_array_equal(g[~valid], 0, err_msg=name)
      np.testing.assert_allclose(g_noisy, g, rtol=1e-5, atol=1e-7, err_msg=name)
  # The contrastive accuracies count the valid pairs only.
  _, metrics = contrastive(video, video, INIT_LOGIT_SCALE, valid=valid)
  assert float(metrics["v2t_acc"]) == 1.0


def _reference_sms(s, r, valid, margin=0.6, threshold=0.1, adaptive=False):
  """SMS-Loss's SymmetricMultiSimiliarityLoss (fix_norm) and, with
  `adaptive`, its AdaptiveMaxMarginRankingLoss, term by term: for the
  positive pair i and each other valid j, caption i's video against video
  j, then video i's caption against caption j."""
  eps = 1.1 / 240
  terms = []
  for i in np.flatnonzero(valid):
    for j in np.flatnonzero(valid):
      if i == j:
        continue
      for other_s, other_r in ((s[j, i], r[j, i]), (s[i, j], r[i, j])):
        d = s[i, i] - other_s
        if adaptive:
          terms.append(max(0.0, r[i, i] * margin - d))
          continue
        w = r[i, i] - other_r
        gap = w * margin - d
        if w > eps:
          terms.append(max(0.0, gap))
        elif abs(w) < eps:
          terms.append(max(0.0, abs(gap) - threshold))
        else:
          terms.append(max(0.0, -gap))
  return np.mean(terms)


def test_sms_and_relevancy_margin_losses_match_loops():
  """Ties in the similarities, relevancies equal to the positive's, above
  and below it, and invalid elements: the losses are the reference's, and
  their gradients are finite."""
  rng = np.random.default_rng(5)
  b = 9
  s = rng.uniform(-1, 1, (b, b)).astype(np.float32)
  s[2, 5] = s[5, 2] = s[2, 2]  # Ties with a positive.
  s[7] = s[7, 7]
  # Relevancies in 1/240 steps as the reference's uint8 matrix: some equal
  # to the positive's, some above it, half of them 0.
  r = (rng.integers(0, 241, (b, b)) * (rng.random((b, b)) < 0.5)) / 240
  r[np.arange(b), np.arange(b)] = rng.choice([120, 240], b) / 240
  r[1, 4] = r[4, 1] = r[1, 1]
  r[3, 6] = r[3, 3] - 1 / 240  # Within the reference's eps: as relevant.
  r[6, 0] = min(r[6, 6] + 0.25, 1.0)  # More relevant than the positive.
  r = r.astype(np.float32)
  for valid in (np.ones(b, bool), np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], bool)):
    for margin, threshold in ((0.6, 0.1), (0.2, 0.0)):
      got = losses.sms_loss(
        s, r, margin=margin, threshold=threshold, valid=valid
      )
      np.testing.assert_allclose(
        got, _reference_sms(s, r, valid, margin, threshold), rtol=1e-5
      )
    np.testing.assert_allclose(
      losses.relevancy_max_margin_loss(s, r, margin=0.4, valid=valid),
      _reference_sms(s, r, valid, 0.4, adaptive=True),
      rtol=1e-5,
    )
  grads = jax.grad(
    lambda s: losses.sms_loss(s, r) + losses.relevancy_max_margin_loss(s, r)
  )(s)
  assert np.isfinite(grads).all() and np.abs(grads).sum() > 0
