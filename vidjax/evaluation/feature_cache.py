"""A probe's training data: its frozen encoder's features, computed once.

A probe (`model.probe`: 'linear' or 'attentive', `videomae.Classifier`)
never changes its encoder, so the encoder runs over the training clips once:
`FeatureBatches` reads each training record as an evaluation does (its
`data.eval_clips` x `data.eval_crops` views, no augmentation), keeps the
features (`steps.features`) with the labels in
WORKDIR/features/train.npz, then yields training batches of rows of that
file: a permutation per epoch drawn from the seed, the position in rows
saved with each checkpoint, so a resumed run continues with the same
batches, reading the file instead of the videos. The cache is made by the
first batch asked for, after start-up, and kept by a resumed run (it
recomputes it if the file is gone or was made for another encoder: the
file records the run's `init_from`, probe and frames per clip).

Sizes: a pooled feature is D float32 (3 KB at ViT-B's 768), a clip's patch
tokens for the attentive probe N x D (16 frames of 224 at ViT-B/16: 1568 x
768 = 4.8 MB; EGTEA's 8,299 clips: 40 GB): the attentive probe suits
short clips, few tokens or small sets (docs/recipes.md).
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from vidjax.base import rundir
from vidjax.data import pipeline, prefetch

FEATURES = "features"  # WORKDIR/features/
_KEYS = ("features", "label", "index", "view")


def cache_file(workdir: str | os.PathLike) -> Path:
  """WORKDIR/features/train.npz."""
  return rundir.path(workdir, FEATURES) / "train.npz"


def compute(run, config) -> dict[str, np.ndarray]:
  """The frozen encoder's features of every view of the training records.

  Returns:
    `features` float32[R, ...], `label`, `index`, `view` int32[R] for the R
    readable views (unreadable ones are left out), in record order.
  """
  pipe = pipeline.make_pipeline(
    config,
    run.mesh,
    train=False,
    batch_size=config.eval.batch_size,
    records=run.train_records,
  )
  parts = collections.defaultdict(list)
  try:
    for batch in pipe:
      out = run.steps.features(run.state["params"], run.rest, batch)
      out = multihost_utils.process_allgather(out, tiled=True)
      keep = np.asarray(out["valid"], bool)
      for key in _KEYS:
        parts[key].append(np.asarray(out[key])[keep])
  finally:
    pipe.close()
  return {k: np.concatenate(v) for k, v in parts.items()}


def _signature(config) -> str:
  return f"{config.init_from}|{config.model.probe}|{config.data.num_frames}"


def load_or_compute(run, config) -> dict[str, np.ndarray]:
  """The cache of `run.workdir`, made (and written) if missing or stale."""
  path = cache_file(run.workdir)
  if path.exists():
    with np.load(path, allow_pickle=False) as f:
      if str(f["signature"]) == _signature(config):
        return {k: f[k] for k in _KEYS}
  arrays = compute(run, config)
  logging.info(
    "probe: the frozen encoder's features of %d training views cached in %s "
    "(%.1f MB)",
    len(arrays["label"]),
    path,
    arrays["features"].nbytes / 1e6,
  )
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, signature=_signature(config), **arrays)
    os.replace(partial, path)  # Whole or absent.
  return arrays


class CachedRows:
  """This process's share of each global batch of cache rows.

  Epoch e visits the rows in the order `permutation(seed, e)`; a batch
  spanning two epochs takes the end of one and the start of the next.
  `get_state()` is {'rows': rows handed out, 'skipped': 0}.
  """

  def __init__(self, load, batch_size: int, seed: int, state=None):
    self._load, self._arrays = load, None
    self.batch_size, self.seed = batch_size, seed
    self.position = int((state or {}).get("rows", 0))

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._arrays is None:
      self._arrays = self._load()
    n = len(self._arrays["label"])
    epochs, within = np.divmod(self.position + np.arange(self.batch_size), n)
    rows = np.empty(self.batch_size, np.int64)
    for epoch in np.unique(epochs):  # One or two (or more: a tiny cache).
      order = np.random.default_rng((self.seed, int(epoch))).permutation(n)
      rows[epochs == epoch] = order[within[epochs == epoch]]
    self.position += self.batch_size
    share = self.batch_size // jax.process_count()
    rows = rows[jax.process_index() * share : (jax.process_index() + 1) * share]
    batch = {k: self._arrays[k][rows] for k in _KEYS}
    batch["valid"] = np.ones(len(rows), bool)
    return batch

  def get_state(self) -> dict:
    return {"rows": self.position, "skipped": 0}


class FeatureBatches(prefetch.DevicePrefetcher):
  """A probe's training batches (the run's `train_batches`): cache rows as
  global device arrays, with what the loop asks of a pipeline."""

  def __init__(self, run, config, state=None):
    rows = CachedRows(
      lambda: load_or_compute(run, config),
      config.batch_size,
      config.seed,
      state,
    )
    super().__init__(rows, 0, run.mesh, name="training")
    self.failures = collections.Counter()  # Nothing is read from video.

  @property
  def skipped(self) -> int:
    return 0

  def close(self, timeout: float = 0.0) -> None:
    del timeout
