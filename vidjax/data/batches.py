"""Batches: the host's local batches from clips, and the global batches' shapes.

`HostBatches` turns Grain's stream of clip groups into this process's
numeric batches, counting failed reads per file and padding a short final
evaluation batch with invalid elements; `batch_spec` describes the global
batches the pipeline yields (the elements' `loader.element_spec` with a
batch axis), for what traces or compiles the steps without reading any
video (the memory check, the benchmarks).
"""

from __future__ import annotations

import collections
import sys

from absl import logging
import jax
import ml_collections
import numpy as np

from vidjax.base import errors
from vidjax.config import defaults
from vidjax.data import loader, workers
from vidjax.data.annotations import ek100_classes

MIN_ATTEMPTS_BEFORE_STOP = 64
# XLA's CPU client uses host arrays in place, without a copy, when they are
# aligned to this many bytes; numpy's own allocations are not.
ALIGNMENT = 64


# Files whose first failed read was logged already (once per process, so the
# evaluation pipelines do not repeat what training said).
_REPORTED_FILES: set[str] = set()


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
  """`np.empty(shape, dtype)` starting on an `ALIGNMENT`-byte boundary."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape)) * dtype.itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % ALIGNMENT
  return raw[start : start + nbytes].view(dtype).reshape(shape)


class BatchBuffers:
  """Batch arrays handed out again once nothing else holds them.

  A fresh batch of frames costs the kernel a page fault and a zeroed page
  per 4 KiB (more than copying the frames in); so `empty` returns a batch
  array made before when neither it nor any view of it is held anywhere:
  not by the caller, a queue, nor a device array (on a CPU, `jax` makes
  them without a copy, holding the array; on a GPU it holds it until the
  transfer is done). Python's reference counts tell: this pool's own are
  counted when the array is made, and an array counted more is in use.
  At most `KEEP` arrays of each shape are kept; past them, fresh ones.
  """

  KEEP = 6

  def __init__(self):
    self._kept: dict[tuple, list[list]] = {}

  @staticmethod
  def _counts(entry: list) -> tuple[int, int]:
    return sys.getrefcount(entry[0]), sys.getrefcount(entry[1])

  def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An `aligned_empty(shape, dtype)`, perhaps one handed out before (its
    old contents in it)."""
    kept = self._kept.setdefault((tuple(shape), np.dtype(dtype).str), [])
    for entry in kept:
      if self._counts(entry) == entry[2]:
        return entry[1]
    if len(kept) >= self.KEEP:
      return aligned_empty(shape, dtype)
    array = aligned_empty(shape, dtype)
    entry = [array.base, array]  # The memory's owner, the array.
    del array
    entry.append(self._counts(entry))  # Held by this pool alone.
    kept.append(entry)
    return entry[1]


def failure_lines(failures: collections.Counter, limit: int = 10) -> list[str]:
  """'FILE: N failed reads' lines, most failures first, at most `limit`."""
  lines = [
    f"{path}: {n} failed read{'s' if n > 1 else ''}"
    for path, n in failures.most_common(limit)
  ]
  if len(failures) > limit:
    lines.append(f"... and {len(failures) - limit} more files")
  return lines


class HostBatches:
  """Grain's groups of clips -> numeric local batches, with skip accounting.

  Builds each batch in the main process, copying group after group into it
  (a worker's `workers.Slot`s out of its /dev/shm blocks, which frees them
  for the worker to reuse).
  Strips the per-element error strings, counts failed reads per file
  (`failures`; the first failure of each file is logged), stops with
  `errors.DataError` when they pass `max_skip_fraction`, and pads a short
  final evaluation batch with invalid elements to the full batch size
  (training drops it).

  Training also stops at a batch without one valid clip: each of its
  elements used up all its attempts. Evaluation reads each clip once and
  keeps the bad ones as invalid elements, so a few unreadable clips (even
  a whole short final batch of them) are counted, never fatal.

  The position (`get_state()['clips']`) counts the clips of this process's
  stream handed out, whatever the workers, threads or clips per transfer:
  a pipeline resumed from it starts its stream at that clip
  (`resume_group`).

  Args:
    iterator: Grain iterator of dicts whose arrays have a leading axis of
      `group` clips, e.g. video uint8[group, T, H, W, 3], valid bool[group],
      errors str[group]; for a resumed run, starting at `resume_group(state,
      group)`.
    batch_size: clips per local batch, a multiple of `group`.
    max_skip_fraction: the share of failed reads that stops the run.
    train: training (drop a short final batch) or evaluation (pad it).
    group: clips per element of `iterator` (`pipeline.clips_per_transfer`).
    state: a `get_state()` to continue from (its counts and position).

  Attributes:
    start, groups: the group of the stream `iterator` starts at, and the
      one it yields next (the one it waits for while in `next`).
  """

  def __init__(
    self,
    iterator,
    batch_size: int,
    max_skip_fraction: float,
    train: bool = False,
    group: int = 1,
    state: dict | None = None,
  ):
    if batch_size % group:
      raise ValueError(
        f"batch size {batch_size} is not a multiple of the "
        f"{group} clips per transfer"
      )
    self._it, self._batch_size, self._group = iterator, batch_size, group
    self._max_fraction, self._train = max_skip_fraction, train
    state = state or {}
    self.start = self.groups = resume_group(state, group) if state else 0
    self.skipped, self.attempts = (
      state.get("skipped", 0),
      state.get("attempts", 0),
    )
    # States saved before the failures were kept have none.
    self.failures = collections.Counter(state.get("failures", {}))
    self._buffers = BatchBuffers()

  def __iter__(self):
    return self

  def _collect(self) -> tuple[dict[str, np.ndarray], list[str], int]:
    """Up to `batch_size` clips: (batch with room for all, their error
    messages, count)."""
    batch, messages, count = {}, [], 0
    while count < self._batch_size:
      try:
        group = dict(next(self._it))
      except StopIteration:
        break
      self.groups += 1
      messages.extend(str(m) for m in group.pop("errors"))
      if not batch:
        batch = {
          k: self._buffers.empty(
            (self._batch_size,) + np.shape(v)[1:],
            v.dtype if isinstance(v, workers.Slot) else np.asarray(v).dtype,
          )
          for k, v in group.items()
        }
      size = len(group["valid"])
      for key, value in group.items():
        if isinstance(value, workers.Slot):
          workers.receive(value, batch[key][count : count + size])
        else:
          batch[key][count : count + size] = value
      count += size
    return batch, messages, count

  def _count(self, message: str) -> None:
    # VideoReadError messages start with the file: "PATH: problem".
    path = message.split(": ", 1)[0]
    if path not in _REPORTED_FILES:
      _REPORTED_FILES.add(path)
      logging.warning(
        "cannot read a clip: %s (reported once per file; such "
        "clips are replaced and counted)",
        message,
      )
    self.failures[path] += 1

  def __next__(self) -> dict[str, np.ndarray]:
    batch, messages, count = self._collect()
    if not count or (count < self._batch_size and self._train):
      raise StopIteration
    skipped = int(batch["skipped"][:count].sum())
    self.skipped += skipped
    self.attempts += skipped + int(batch["valid"][:count].sum())
    for message in (m for text in messages for m in text.split("\n") if m):
      self._count(message)
    fraction = self.skipped / max(self.attempts, 1)
    if (self._train and not batch["valid"][:count].any()) or (
      self.attempts >= MIN_ATTEMPTS_BEFORE_STOP
      and fraction > self._max_fraction
    ):
      raise errors.DataError(
        f"{self.skipped} of {self.attempts} clip reads failed ({fraction:.0%}),"
        f" in {len(self.failures)} file{'s' if len(self.failures) > 1 else ''}"
        ":\n  " + "\n  ".join(failure_lines(self.failures)),
        hint="re-chunk or remove those videos; the limit is "
        f"data.max_skip_fraction={self._max_fraction}",
      )
    for value in batch.values():  # A short final eval batch: invalid rows.
      value[count:] = 0
    return batch

  def get_state(self) -> dict:
    """JSON-able: the position in clips and the counts, failures per file."""
    return {
      "clips": self.groups * self._group,
      "skipped": self.skipped,
      "attempts": self.attempts,
      "failures": dict(self.failures),
    }

  def close(self) -> None:
    """Stops Grain's worker processes, if it has any."""
    if hasattr(self._it, "close"):
      self._it.close()


def resume_group(state: dict, group: int) -> int:
  """The group of `group` clips a `HostBatches.get_state()` resumes at.

  Raises:
    errors.ConfigError: the position is not a whole number of groups (the
      local batch changed).
  """
  if "clips" in state:
    clips = state["clips"]
  else:  # Saved by vidjax before the position was counted in clips: Grain's
    # own state (of one iterator, or one per worker), counting groups.
    grain = state["grain"]
    clips = state.get("clips_per_transfer", 1) * sum(
      s["next_index"]
      for s in grain.get("iterators_in_use_states", [grain])
      if s
    )
  if clips % group:
    raise errors.ConfigError(
      f"the data iterator was saved {clips} clips into its stream, which "
      f"is not a whole number of this run's transfers of {group} clips "
      "(the batch size changed): resume with the saved run's batch size, "
      "or start a new workdir from its weights with --config.init_from"
    )
  return clips // group


def target_keys(
  config: ml_collections.ConfigDict, *, train: bool = True
) -> tuple[str, ...]:
  """The per-clip targets the config's task reads, beside the video.

  tokens for video-text tasks; label for classification (and verb, noun
  for data.format 'ek100_cls'); in training with a relevancy-aware loss
  (`defaults.needs_relevancy`), verb and `ek100_classes.KEYS`. The
  pipeline's batches carry these only, whatever else the annotation rows
  have.
  """
  keys = ("tokens",) if defaults.needs_text(config.task) else ()
  if train and defaults.needs_relevancy(config):
    keys += ("verb",) + ek100_classes.KEYS
  if config.task == "classification":
    keys += ("label",) + (
      ("verb", "noun") if config.data.format == "ek100_cls" else ()
    )
  return keys


def batch_spec(
  config: ml_collections.ConfigDict, batch_size: int, *, train: bool = True
) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes and dtypes of the global batches `make_pipeline` yields.

  For tracing, compiling or timing the steps without reading any video: the
  keys are those the config's task reads.

  Args:
    config: the run config (reads `task` and `data`).
    batch_size: global batch size B (in training, views: with
      `data.repeats` R > 1 the batches hold B / R canvases, as
      `loader.ClipSpec.from_config(data, train=True)`).
    train: the training batches' shapes, else evaluation's.

  Returns:
    dict of `jax.ShapeDtypeStruct`: video uint8[B, T, H, W, 3]; tokens
    int32[B, L] for video-text tasks (L: `model.text.context_length`);
    label int32[B] for classification (and verb, noun for data.format
    'ek100_cls'); a probe's training batches (`model.probe`) hold its
    cached `features` float32[B, D] (attentive: [B, N, D], N patch
    tokens) instead of video; with a relevancy-aware loss in training, verb,
    relevancy_row, relevancy_column, caption_verb int32[B] and nouns,
    caption_nouns int32[B, data.max_nouns]; index, view, skipped int32[B];
    valid bool[B].
  """
  if train and config.model.get("probe"):
    return _probe_batch_spec(config, batch_size)
  text = config.model.get("text")
  repeats = config.data.get("repeats", 1) if train else 1
  batch_size //= repeats
  spec = loader.element_spec(
    loader.ClipSpec.from_config(config.data, train=train),
    target_keys(config, train=train),
    text.context_length if text else defaults.CONTEXT_LENGTH,
    max_nouns=config.data.get("max_nouns", 0),
  )
  return {
    k: jax.ShapeDtypeStruct((batch_size,) + shape, dtype)
    for k, (shape, dtype) in spec.items()
  }


def _probe_batch_spec(
  config: ml_collections.ConfigDict, batch_size: int
) -> dict[str, jax.ShapeDtypeStruct]:
  """A probe's training batches: the frozen encoder's cached features
  (`vidjax.evaluation.feature_cache`), label, index, view, valid."""
  model, data = config.model, config.data
  sizes = defaults.parse_variant(model.variant)
  width = model.get("width") or sizes["width"]
  shape = (width,)
  if model.probe == "attentive":
    height, wide = (
      data.size if isinstance(data.size, (tuple, list)) else ((data.size,) * 2)
    )
    patch = sizes["patch_size"]
    frames = data.num_frames // model.get("tubelet", 1)
    shape = (frames * (height // patch) * (wide // patch), width)
  out = {"features": ((batch_size, *shape), np.float32)}
  out.update({k: ((batch_size,), np.int32) for k in ("label", "index", "view")})
  out["valid"] = ((batch_size,), np.bool_)
  return {k: jax.ShapeDtypeStruct(*v) for k, v in out.items()}
