"""Pretraining from a frozen CLIP teacher: UMT's masked alignment.

The model (`vidjax.models.umt.UMT`) holds the student and the frozen
teacher. A training step: the teacher's features of the last K layers and
its class-token attention on every frame (no gradients); the tokens each
frame keeps (`model.select`: UMT's draw by that attention, top-k or
random, `1 - model.mask_ratio` of them); the student on the kept tokens;
the loss `config.loss.align` between the student's and the teacher's
normalised features of the kept tokens, over the K layers, the tokens and
the valid examples:

  'l2'         UMT's: 2 - 2 cos (mean over layers and tokens)
  'mse'        the mean squared difference (PyTorch's MSELoss)
  'smooth_l1'  PyTorch's SmoothL1Loss (beta 1)

Every clip keeps as many tokens, so the mean of the per-example losses is
UMT's mean over every aligned token. Eval: the `l2` loss on held-out clips
(`eval/loss`), its tokens drawn with a fixed key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vidjax.tasks import common, losses

# The key evaluations draw their kept tokens with: the same every time.
_EVAL_SEED = 0


def align_error(
  predictions: jax.Array, targets: jax.Array, kind: str = "l2"
) -> jax.Array:
  """The alignment loss of each example.

  Args:
    predictions: float[K, B, M, E], the student's normalised features.
    targets: float[K, B, M, E], the teacher's of the same tokens.
    kind: 'l2', 'mse' or 'smooth_l1' (`defaults.ALIGN_LOSSES`).

  Returns:
    float32[B]: the mean over the K layers and M tokens (and E for 'mse'
    and 'smooth_l1').
  """
  p, t = predictions.astype(jnp.float32), targets.astype(jnp.float32)
  if kind == "l2":
    per_token = 2.0 - 2.0 * jnp.sum(p * t, axis=-1)
  elif kind == "mse":
    per_token = jnp.mean(jnp.square(p - t), axis=-1)
  elif kind == "smooth_l1":
    d = jnp.abs(p - t)
    per_token = jnp.mean(jnp.where(d < 1.0, 0.5 * d * d, d - 0.5), axis=-1)
  else:
    raise ValueError(f"loss.align={kind!r} is not 'l2', 'mse' or 'smooth_l1'")
  return per_token.mean(axis=(0, 2))


def targets_and_predictions(model, video, key, *, deterministic, rngs=None):
  """(teacher targets, student predictions), float32[K, B, M, E] each,
  of the tokens drawn with `key` from the teacher's attention."""
  features, attention = model.teach(video)
  kept = model.kept_token_ids(attention, key)
  targets = jnp.take_along_axis(features, kept[None, :, :, None], axis=2)
  return targets, model(video, kept, deterministic=deterministic, rngs=rngs)


def augment_config(config, *, train: bool) -> dict:
  augment = dict(config.augment)
  if not train:
    return common.eval_augment(augment)
  return {**augment, **common.repeat_keys(config)}


def loss(model, batch, key, config):
  select_key, drop_key = jax.random.split(key)
  targets, predictions = targets_and_predictions(
    model, batch["video"], select_key, deterministic=False, rngs=drop_key
  )
  per_example = align_error(predictions, targets, config.loss.align)
  return losses.masked_mean(per_example, batch.get("valid")), {}


def eval_outputs(model, batch):
  targets, predictions = targets_and_predictions(
    model,
    batch["video"],
    jax.random.key(_EVAL_SEED),
    deterministic=True,
  )
  return {"loss": align_error(predictions, targets, "l2")}


def eval_metrics(outputs, config) -> dict[str, float]:
  del config
  out = common.valid_outputs(outputs)
  return {"loss": float(np.mean(out["loss"]))}
