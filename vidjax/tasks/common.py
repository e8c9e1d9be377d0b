"""Helpers shared by the task modules: view averaging and normalisation."""
from __future__ import annotations

import numpy as np


def valid_outputs(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Drops the padding rows of evaluation outputs."""
  keep = outputs["valid"].astype(bool)
  return {k: v[keep] for k, v in outputs.items()}


def mean_by_index(values: np.ndarray, index: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Averages rows that share a record index (multi-clip x multi-crop views).

  Returns:
    (ids int[U] sorted, means float64[U, ...]).
  """
  ids, group = np.unique(index, return_inverse=True)
  sums = np.zeros((len(ids),) + values.shape[1:])
  np.add.at(sums, group.reshape(-1), values)
  return ids, sums / np.bincount(group.reshape(-1)).reshape(
      (-1,) + (1,) * (values.ndim - 1))


def l2_normalize(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
