"""Helpers shared by the task modules."""

from __future__ import annotations

import numpy as np

# The training augment keys an evaluation applies too: the normalisation and
# the frames' dtype; no flips, RandAugment or mixing (AVION, VideoMAE).
EVAL_AUGMENT_KEYS = ("mean", "std", "dtype")


def eval_augment(augment: dict) -> dict:
  """The keys of a training augment config that evaluation keeps."""
  return {k: v for k, v in augment.items() if k in EVAL_AUGMENT_KEYS}


def valid_outputs(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Drops the padding rows of evaluation outputs."""
  keep = outputs["valid"].astype(bool)
  return {k: v[keep] for k, v in outputs.items()}
