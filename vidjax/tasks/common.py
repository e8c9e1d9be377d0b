"""Helpers shared by the task modules."""

from __future__ import annotations

import numpy as np

from vidjax.data import loader

# The training augment keys an evaluation applies too: the normalisation and
# the frames' dtype; no flips, RandAugment or mixing (AVION, VideoMAE).
EVAL_AUGMENT_KEYS = ("mean", "std", "dtype")


def eval_augment(augment: dict) -> dict:
  """The keys of a training augment config that evaluation keeps."""
  return {k: v for k, v in augment.items() if k in EVAL_AUGMENT_KEYS}


def repeat_keys(config) -> dict:
  """The training augment's keys for `data.repeats` (`vidjax.augment.views`): the
  views' count and their crop, flip and size; none without repeats."""
  data = config.data
  if data.get("repeats", 1) <= 1:
    return {}
  spec = loader.ClipSpec.from_config(data)
  return {
    "repeats": data.repeats,
    "views": {
      "crop": spec.crop,
      "crop_scale": spec.crop_scale,
      "hflip": spec.hflip,
      "size": spec.size,
    },
  }


def valid_outputs(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Drops the padding rows of evaluation outputs."""
  keep = outputs["valid"].astype(bool)
  return {k: v[keep] for k, v in outputs.items()}
