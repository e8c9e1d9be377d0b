"""VideoMAE pretraining: reconstruct the pixels of masked tubes.

The tube mask (ratio `model.mask_ratio`, 0.9) is drawn on the device by
`augment`; the model encodes visible tokens only and returns the MSE on masked
patches of per-patch-normalised pixels, averaged over the valid examples.
Eval: the same loss on held-out clips.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from vidjax.config import defaults
from vidjax.tasks import common, losses


def augment_config(config, *, train: bool) -> dict:
  augment = dict(config.augment)
  patch = defaults.parse_variant(config.model.variant)["patch_size"]
  # The tube mask in evaluation too: the model reconstructs masked tubes.
  return {
    **(
      {**augment, **common.repeat_keys(config)}
      if train
      else common.eval_augment(augment)
    ),
    "mask_ratio": config.model.mask_ratio,
    "tubelet": config.model.tubelet,
    "patch": patch,
  }


def loss(model, batch, key, config):
  del config
  value, predictions, targets = model(
    batch["video"],
    batch["mask"],
    deterministic=False,
    rngs=key,
    return_predictions=True,
  )
  # The model's loss averages every example; keep its NaN for a bad mask,
  # but average over the valid examples only (each has as many patches).
  per_example = losses.reconstruction_error(predictions, targets)
  value = jnp.where(
    jnp.isnan(value), value, losses.masked_mean(per_example, batch.get("valid"))
  )
  return value, {}


def eval_outputs(model, batch):
  # Per-example losses, so that padded rows can be dropped exactly.
  _, predictions, targets = model(
    batch["video"], batch["mask"], return_predictions=True
  )
  return {"loss": losses.reconstruction_error(predictions, targets)}


def eval_metrics(outputs, config) -> dict[str, float]:
  del config
  out = common.valid_outputs(outputs)
  return {"loss": float(np.mean(out["loss"]))}
