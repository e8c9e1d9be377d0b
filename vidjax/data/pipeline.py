"""The Grain graph: records -> per-process uint8 batches -> global device arrays.

    records --range/shuffle/repeat--> element ids
            --random_map(ClipLoader)--> decoded clips      (workers or threads)
            --slice per process, batch--> local numpy batches
            --skip accounting, eval padding--> HostBatches
            --DevicePrefetcher--> global jax.Arrays sharded on the batch axis

Per-element randomness comes from Grain's per-element seeds (seed + element
index), so the batches are the same whatever the number of workers or
threads. The iterator state (Grain's state plus the skip counters) is
captured after each batch actually handed to the caller, so a restored
pipeline reproduces the following batches exactly.

Config keys (`config.data`, see `default_data_config`):
  root            chunk store (written by `python -m vidjax.data.chunk`)
  train_annotations / eval_annotations   annotation files
  format          jsonl | ego4d | ek100_cls | ek100_mir | kinetics
  label           for ek100_cls: action | verb | noun
  allow_pickle    let `ego4d` / relevancy loaders unpickle (runs code!)
  vocab           CLIP BPE vocabulary (bpe_simple_vocab_16e6.txt.gz) for text
  num_frames, sampling, stride, size, crop, crop_scale, hflip,
  eval_clips, eval_crops                 see `source.ClipSpec`
  workers         Grain worker processes (0: in the main process)
  threads         reader threads per process (PyAV releases the GIL)
  worker_buffer   batches buffered per worker
  device_prefetch batches in flight to the devices
  max_skip_fraction  stop when more than this share of reads failed
  max_attempts    reads per training element before giving up on it
  max_bad_row_fraction  stop at start-up when more than this share of an
                  annotation file's rows are bad (`vidjax.data.checks`)

A failed read is logged when a file fails for the first time (once per
file and process), counted per file (`HostBatches.failures`), and the
`DataError` past `max_skip_fraction` lists each bad file once with its count.
"""
from __future__ import annotations

import collections

from absl import flags
from absl import logging
import grain
import jax
import ml_collections
import numpy as np

from vidjax import sharding
from vidjax.data import annotations, source
from vidjax.errors import DataError  # pylint: disable=unused-import  (re-exported)

MIN_ATTEMPTS_BEFORE_STOP = 64


def default_data_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      root="", train_annotations="", eval_annotations="", format="jsonl",
      label="action", allow_pickle=False, vocab="",
      num_frames=16, sampling="segment", stride=4, size=224,
      crop="random_resized", crop_scale=(0.5, 1.0), hflip=0.5,
      eval_clips=1, eval_crops=1,
      workers=0, threads=0, worker_buffer=2, device_prefetch=2,
      max_skip_fraction=0.25, max_attempts=10, max_bad_row_fraction=0.01))


def clip_spec(data: ml_collections.ConfigDict) -> source.ClipSpec:
  size = data.size if isinstance(data.size, (tuple, list)) else (data.size,) * 2
  return source.ClipSpec(
      num_frames=data.num_frames, sampling=data.sampling, stride=data.stride,
      size=tuple(size), crop=data.crop, crop_scale=tuple(data.crop_scale),
      hflip=data.hflip, eval_clips=data.eval_clips, eval_crops=data.eval_crops)


def load_annotations(data: ml_collections.ConfigDict, path: str):
  """Records of one annotation file, in the configured format."""
  kw = {}
  if data.format == "ego4d":
    kw["allow_pickle"] = data.allow_pickle
  if data.format == "ek100_cls":
    kw["label"] = data.label
    if data.label == "action":
      files = [p for p in (data.train_annotations, data.eval_annotations) if p]
      kw["action_map"] = annotations.ek100_action_map(files)
  return annotations.load_records(data.format, path, **kw)


# Files whose first failed read was logged already (once per process, so the
# evaluation pipelines do not repeat what training said).
_REPORTED_FILES: set[str] = set()


def failure_lines(failures: collections.Counter, limit: int = 10) -> list[str]:
  """'FILE: N failed reads' lines, most failures first, at most `limit`."""
  lines = [f"{path}: {n} failed read{'s' if n > 1 else ''}"
           for path, n in failures.most_common(limit)]
  if len(failures) > limit:
    lines.append(f"... and {len(failures) - limit} more files")
  return lines


class HostBatches:
  """Grain iterator -> numeric local batches, with skip accounting.

  Strips the per-element error strings, counts failed reads per file
  (`failures`; the first failure of each file is logged), stops with
  `DataError` when they pass `max_skip_fraction`, and pads a short final
  evaluation batch with invalid elements to the full batch size.
  """

  def __init__(self, iterator, batch_size: int, max_skip_fraction: float):
    self._it, self._batch_size = iterator, batch_size
    self._max_fraction = max_skip_fraction
    self.skipped = self.attempts = 0
    self.failures = collections.Counter()  # file -> failed reads

  def __iter__(self):
    return self

  def _count(self, message: str) -> None:
    # VideoReadError messages start with the file: "PATH: problem".
    path = message.split(": ", 1)[0]
    if path not in _REPORTED_FILES:
      _REPORTED_FILES.add(path)
      logging.warning("cannot read a clip: %s (reported once per file; such "
                      "clips are replaced and counted)", message)
    self.failures[path] += 1

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self._it))
    errors = batch.pop("errors")
    skipped = int(batch["skipped"].sum())
    self.skipped += skipped
    self.attempts += skipped + int(batch["valid"].sum())
    for message in (m for msgs in errors for m in str(msgs).split("\n") if m):
      self._count(message)
    fraction = self.skipped / max(self.attempts, 1)
    if not batch["valid"].any() or (self.attempts >= MIN_ATTEMPTS_BEFORE_STOP
                                    and fraction > self._max_fraction):
      raise DataError(
          f"{self.skipped} of {self.attempts} clip reads failed ({fraction:.0%}),"
          f" in {len(self.failures)} files:\n  "
          + "\n  ".join(failure_lines(self.failures)),
          hint="re-chunk or remove those videos; the limit is "
          f"data.max_skip_fraction={self._max_fraction}")
    short = self._batch_size - len(batch["valid"])
    if short > 0:
      batch = {k: np.concatenate([v, np.zeros((short,) + v.shape[1:], v.dtype)])
               for k, v in batch.items()}
    return batch

  def get_state(self) -> dict:
    return {"grain": self._it.get_state(), "skipped": self.skipped,
            "attempts": self.attempts}

  def set_state(self, state: dict) -> None:
    self._it.set_state(state["grain"])
    self.skipped, self.attempts = state["skipped"], state["attempts"]


def _mark_flags_parsed(worker_index: int = 0, worker_count: int = 1) -> None:
  # Grain reads absl flags in the parent and in its spawned workers; outside
  # an absl app (notebooks, tests) they were never parsed, which raises
  # UnparsedFlagAccessError. Defaults are what we want: mark them parsed.
  del worker_index, worker_count
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def make_dataset(loader: source.ClipLoader, *, batch_size: int, train: bool,
                 seed: int, num_epochs: int | None = None, workers: int = 0,
                 threads: int = 0, worker_buffer: int = 2,
                 process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The Grain graph of local batches for this process.

  Args:
    loader: element loader over the records.
    batch_size: examples per batch in THIS process.
    train: shuffle, repeat, random augmentation; else every (record, view)
      once in order.
    seed: shuffle and augmentation seed.
    num_epochs: training epochs (None: forever).
    workers, threads, worker_buffer: parallelism (see module docstring).
    process_index, process_count: this process's shard of every batch.
  """
  if train:
    ds = grain.MapDataset.range(len(loader.records)).shuffle(seed=seed)
    ds = ds.repeat(num_epochs).random_map(loader.train_element, seed=seed)
  else:
    ds = grain.MapDataset.range(len(loader.records) * loader.spec.views)
    ds = ds.map(loader.eval_element)
  # Slicing after the map keeps each element's seed independent of the
  # number of processes.
  ds = ds[process_index::process_count]
  ds = ds.batch(batch_size, drop_remainder=train)
  ds = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=threads, prefetch_buffer_size=max(2 * threads, 1)))
  if workers > 0:
    _mark_flags_parsed()
    ds = ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers,
                                     per_worker_buffer_size=worker_buffer),
        worker_init_fn=_mark_flags_parsed)
  return ds


def make_pipeline(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                  *, train: bool, batch_size: int, tokenizer=None,
                  records=None, num_epochs: int | None = None,
                  seed: int | None = None) -> sharding.DevicePrefetcher:
  """Global device batches for training or evaluation.

  Args:
    config: the run config (reads `config.data` and `config.seed`).
    mesh: device mesh; batches are sharded over its batch axes.
    train: training (shuffled, augmented, endless unless `num_epochs`) or
      evaluation (each record's views once, final batch padded, `valid` mask).
    batch_size: GLOBAL batch size; split over processes.
    tokenizer: `vidjax.data.tokenizer.Tokenizer` for text records.
    records: clip records; default: load the configured annotation file.
    num_epochs: stop after this many epochs (training).
    seed: default `config.seed`.

  Returns:
    An iterator of dicts of `jax.Array` (video uint8[B, T, H, W, 3], tokens /
    label / verb / noun, index, view, valid, skipped) with `get_state()`;
    resume with `pipeline.restored(state)`.
  """
  data = config.data
  if batch_size % jax.process_count():
    raise ValueError(f"batch size {batch_size} does not divide over "
                     f"{jax.process_count()} processes")
  if records is None:
    path = data.train_annotations if train else data.eval_annotations
    records = load_annotations(data, path)
  loader = source.ClipLoader(records, data.root, clip_spec(data), tokenizer,
                             max_attempts=data.max_attempts)
  local = batch_size // jax.process_count()
  ds = make_dataset(
      loader, batch_size=local, train=train,
      seed=config.seed if seed is None else seed, num_epochs=num_epochs,
      workers=data.workers, threads=data.threads,
      worker_buffer=data.worker_buffer, process_index=jax.process_index(),
      process_count=jax.process_count())
  return Pipeline(ds, local, data.max_skip_fraction, mesh,
                  data.device_prefetch)


class Pipeline(sharding.DevicePrefetcher):
  """Device batches plus the state needed to resume them exactly."""

  def __init__(self, dataset: grain.IterDataset, local_batch: int,
               max_skip_fraction: float, mesh, prefetch: int, state=None):
    self._args = (dataset, local_batch, max_skip_fraction, mesh, prefetch)
    self.host = HostBatches(iter(dataset), local_batch, max_skip_fraction)
    if state is not None:
      self.host.set_state(state)
    super().__init__(self.host, prefetch, mesh)

  def restored(self, state: dict) -> "Pipeline":
    """A new pipeline positioned at `state` (from `get_state()`); closes this."""
    self.close()
    return Pipeline(*self._args, state=state)

  def close(self):
    super().close()
    grain_iterator = getattr(self.host, "_it", None)
    if hasattr(grain_iterator, "close"):  # Stops Grain's worker processes.
      grain_iterator.close()

  @property
  def skipped(self) -> int:
    """Failed reads so far, as of the batches handed out (`data/skipped`)."""
    state = self.get_state()
    return state["skipped"] if state else 0

