"""The Grain graph: records -> per-process uint8 batches -> global device arrays.

    records --range/shuffle/repeat--> element ids
            --random_map(ClipLoader)--> decoded clips      (workers or threads)
            --slice per process--> this process's clips, one at a time
            --HostBatches: batch, skip accounting, eval padding--> local batches
            --DevicePrefetcher--> global jax.Arrays sharded on the batch axis

Workers hand the main process single clips, never whole batches: Grain
passes each through its own /dev/shm block, and the main process copies it
into the batch and frees the block at once. What sits in /dev/shm is
therefore a few clips per worker (`shared_memory_bytes`), whatever the
global batch; a batch of 2048 clips built inside each of 16 workers could
hold tens of GB there and kill a container with a small /dev/shm (SIGBUS).
`make_pipeline` checks the room at start-up.

Per-element randomness comes from Grain's per-element seeds (seed + element
index), and workers' clips are interleaved in element order, so the batches
are the same whatever the number of workers or threads. The iterator state
(Grain's state plus the skip counters) is captured after each batch actually
handed to the caller, so a restored pipeline reproduces the following
batches exactly.

Config keys (`config.data`, see `default_data_config`):
  root            chunk store (written by `python -m vidjax.data.chunk`)
  train_annotations / eval_annotations   annotation files; several training
                  files separated by commas are concatenated (LaViLa's
                  rephraser + narrator narrations)
  format          jsonl | ego4d | ek100_cls | ek100_mir | kinetics |
                  kinetics_list (see `vidjax.data.annotations`)
  label           for ek100_cls: action | verb | noun
  allow_pickle    let `ego4d` / relevancy loaders unpickle (runs code!)
  train_sentences, train_relevancy   EK-100 MIR training positives: each
                  clip is paired with a caption of the sentence CSV drawn
                  among those of relevancy > positive_threshold to it (AVION)
  positive_threshold  0.1
  vocab           CLIP BPE vocabulary (bpe_simple_vocab_16e6.txt.gz) for text
  num_frames, sampling, stride, size, crop, crop_scale, hflip,
  eval_clips, eval_crops                 see `source.ClipSpec`
  workers         Grain worker processes (0: in the main process)
  threads         reader threads per process (PyAV releases the GIL)
  worker_buffer   clips buffered per worker (and as many on the main side)
  device_prefetch batches in flight to the devices
  max_skip_fraction  stop when more than this share of reads failed
  max_attempts    reads per training element before giving up on it
  max_bad_row_fraction  stop at start-up when more than this share of an
                  annotation file's rows are bad (`vidjax.data.checks`)
  synthetic       the synthetic corpus used when no data path is set
                  (`enabled`, its size and `seed`; `vidjax.data.synthetic`)

A failed read is logged when a file fails for the first time (once per
file and process), counted per file (`HostBatches.failures`), and the
`DataError` past `max_skip_fraction` lists each bad file once with its count.
"""
from __future__ import annotations

import collections
import functools
import os
import shutil

from absl import flags
from absl import logging
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vidjax import errors, sharding, tasks
from vidjax.data import annotations, ek100, source
from vidjax.errors import DataError  # pylint: disable=unused-import  (re-exported)

MIN_ATTEMPTS_BEFORE_STOP = 64
SHM_DIR = "/dev/shm"
# Arrays smaller than this cross from workers pickled, not through /dev/shm:
# a block per token array or label would cost more than the copy.
MIN_SHM_BYTES = 4096


def default_data_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      root="", train_annotations="", eval_annotations="", format="jsonl",
      label="action", allow_pickle=False, vocab="",
      train_sentences="", train_relevancy="", positive_threshold=0.1,
      num_frames=16, sampling="segment", stride=4, size=224,
      crop="random_resized", crop_scale=(0.5, 1.0), hflip=0.5,
      eval_clips=1, eval_crops=1,
      workers=0, threads=0, worker_buffer=8, device_prefetch=2,
      max_skip_fraction=0.25, max_attempts=10, max_bad_row_fraction=0.01,
      synthetic=ml_collections.ConfigDict(dict(
          enabled=False, num_videos=96, segments_per_video=2,
          segment_seconds=3.0, height=96, width=128, seed=0,
          relevancy=False))))


def clip_spec(data: ml_collections.ConfigDict) -> source.ClipSpec:
  size = data.size if isinstance(data.size, (tuple, list)) else (data.size,) * 2
  return source.ClipSpec(
      num_frames=data.num_frames, sampling=data.sampling, stride=data.stride,
      size=tuple(size), crop=data.crop, crop_scale=tuple(data.crop_scale),
      hflip=data.hflip, eval_clips=data.eval_clips, eval_crops=data.eval_crops)


def split_paths(value: str) -> list[str]:
  """'a.jsonl,b.jsonl' -> ['a.jsonl', 'b.jsonl'] (several annotation files)."""
  return [p.strip() for p in str(value).split(",") if p.strip()]


def load_annotations(data: ml_collections.ConfigDict, path: str):
  """Records of an annotation file (or of comma-separated files, in order)."""
  kw = {}
  if data.format == "ego4d":
    kw["allow_pickle"] = data.allow_pickle
  if data.format == "ek100_cls":
    kw["label"] = data.label
    if data.label == "action":
      files = [p for value in (data.train_annotations, data.eval_annotations)
               for p in split_paths(value)]
      kw["action_map"] = annotations.ek100_action_map(files)
  return annotations.load_records(data.format, split_paths(path), **kw)


def caption_positives(data: ml_collections.ConfigDict, records):
  """EK-100 MIR training positives (`data.train_relevancy`), or None."""
  if not data.train_relevancy:
    return None
  files = split_paths(data.train_annotations)
  if data.format != "ek100_mir" or len(files) != 1 or not data.train_sentences:
    raise errors.ConfigError(
        "data.train_relevancy needs data.format='ek100_mir', one "
        "data.train_annotations file (EPIC_100_retrieval_train.csv) and "
        "data.train_sentences (EPIC_100_retrieval_train_sentence.csv)")
  return ek100.mir_positives(
      records, files[0], data.train_sentences, data.train_relevancy,
      threshold=data.positive_threshold, allow_pickle=data.allow_pickle)


def batch_spec(config: ml_collections.ConfigDict,
               batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes and dtypes of the global batches `make_pipeline` yields.

  For tracing, compiling or timing the steps without reading any video: the
  keys are those the config's task reads.

  Args:
    config: the run config (reads `task` and `data`).
    batch_size: global batch size B.

  Returns:
    dict of `jax.ShapeDtypeStruct`: video uint8[B, T, H, W, 3]; tokens
    int32[B, 77] for video-text tasks; label int32[B] for classification
    (and verb, noun for data.format 'ek100_cls'); index, view, skipped
    int32[B]; valid bool[B].
  """
  data = config.data
  height, width = clip_spec(data).size
  spec = {"video": ((data.num_frames, height, width, 3), np.uint8)}
  if tasks.get_task(config.task).NEEDS_TEXT:
    spec["tokens"] = ((source.CONTEXT_LENGTH,), np.int32)
  if config.task == "classification":
    names = ["label"] + (["verb", "noun"] if data.format == "ek100_cls" else [])
    spec.update({name: ((), np.int32) for name in names})
  spec.update(index=((), np.int32), view=((), np.int32), valid=((), np.bool_),
              skipped=((), np.int32))
  return {k: jax.ShapeDtypeStruct((batch_size,) + shape, dtype)
          for k, (shape, dtype) in spec.items()}


def random_batch(config: ml_collections.ConfigDict, batch_size: int,
                 mesh: jax.sharding.Mesh, seed: int = 0) -> dict[str, jax.Array]:
  """A device-resident random batch of `batch_spec`, sharded as the pipeline's.

  Frames are uniform uint8, tokens uniform over the text tower's vocabulary,
  labels over the classifier's classes; every element is valid. Made on the
  devices, so that a benchmark times the step without the host in the way.
  """
  spec = batch_spec(config, batch_size)
  high = {name: config.model.text.vocab_size if name == "tokens"
          else config.model.num_classes
          for name in ("tokens", "label", "verb", "noun") if name in spec}

  @functools.partial(jax.jit, out_shardings=sharding.batch_sharding(mesh))
  def make(key):
    keys = dict(zip(spec, jax.random.split(key, len(spec))))
    out = {}
    for name, s in spec.items():
      if name == "video":
        out[name] = jax.random.bits(keys[name], s.shape, jnp.uint8)
      elif name in high:
        out[name] = jax.random.randint(keys[name], s.shape, 0, high[name],
                                       jnp.int32)
      elif name == "index":
        out[name] = jnp.arange(batch_size, dtype=jnp.int32)
      else:  # view, skipped: 0; valid: True.
        out[name] = jnp.full(s.shape, name == "valid", s.dtype)
    return out

  return make(jax.random.key(seed))


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
  """Grain's clips -> numeric local batches, with skip accounting.

  Builds each batch in the main process, copying clip after clip into it so
  that each clip's /dev/shm block is freed before the next arrives. Strips
  the per-element error strings, counts failed reads per file (`failures`;
  the first failure of each file is logged), stops with
  `DataError` when they pass `max_skip_fraction`, and pads a short final
  evaluation batch with invalid elements to the full batch size (training
  drops it).
  """

  def __init__(self, iterator, batch_size: int, max_skip_fraction: float,
               drop_remainder: bool = False):
    self._it, self._batch_size = iterator, batch_size
    self._max_fraction, self._drop_remainder = max_skip_fraction, drop_remainder
    self.skipped = self.attempts = 0
    self.failures = collections.Counter()  # file -> failed reads

  def __iter__(self):
    return self

  def _collect(self) -> tuple[dict[str, np.ndarray], list[str], int]:
    """Up to `batch_size` clips: (batch with room for all, errors, count)."""
    batch, errors, count = {}, [], 0
    for element in self._it:
      element = dict(element)
      errors.append(str(element.pop("errors")))
      if not batch:
        batch = {k: np.empty((self._batch_size,) + np.shape(v),
                             np.asarray(v).dtype) for k, v in element.items()}
      for key, value in element.items():
        batch[key][count] = value  # Copied out; the shm block goes with it.
      count += 1
      if count == self._batch_size:
        break
    return batch, errors, count

  def _count(self, message: str) -> None:
    # VideoReadError messages start with the file: "PATH: problem".
    path = message.split(": ", 1)[0]
    if path not in _REPORTED_FILES:
      _REPORTED_FILES.add(path)
      logging.warning("cannot read a clip: %s (reported once per file; such "
                      "clips are replaced and counted)", message)
    self.failures[path] += 1

  def __next__(self) -> dict[str, np.ndarray]:
    batch, errors, count = self._collect()
    if not count or (count < self._batch_size and self._drop_remainder):
      raise StopIteration
    skipped = int(batch["skipped"][:count].sum())
    self.skipped += skipped
    self.attempts += skipped + int(batch["valid"][:count].sum())
    for message in (m for msgs in errors for m in msgs.split("\n") if m):
      self._count(message)
    fraction = self.skipped / max(self.attempts, 1)
    if not batch["valid"][:count].any() or (
        self.attempts >= MIN_ATTEMPTS_BEFORE_STOP
        and fraction > self._max_fraction):
      raise DataError(
          f"{self.skipped} of {self.attempts} clip reads failed ({fraction:.0%}),"
          f" in {len(self.failures)} files:\n  "
          + "\n  ".join(failure_lines(self.failures)),
          hint="re-chunk or remove those videos; the limit is "
          f"data.max_skip_fraction={self._max_fraction}")
    for value in batch.values():  # A short final eval batch: invalid rows.
      value[count:] = 0
    return batch

  def get_state(self) -> dict:
    return {"grain": self._it.get_state(), "skipped": self.skipped,
            "attempts": self.attempts}

  def set_state(self, state: dict) -> None:
    self._it.set_state(state["grain"])
    self.skipped, self.attempts = state["skipped"], state["attempts"]


def shared_memory_bytes(data: ml_collections.ConfigDict) -> int:
  """The most /dev/shm the workers' clips can take at once (0: no workers).

  Per worker: `worker_buffer` clips in its queue and as many read ahead by
  the main process, plus one being handed over on each side. Only the
  frames go through /dev/shm (`MIN_SHM_BYTES`).
  """
  height, width = clip_spec(data).size
  clip_bytes = data.num_frames * height * width * 3
  return data.workers * (2 * data.worker_buffer + 2) * clip_bytes


def check_shared_memory(data: ml_collections.ConfigDict,
                        path: str = SHM_DIR) -> None:
  """Stops at start-up, saying what to change, if /dev/shm is too small."""
  need = shared_memory_bytes(data)
  if not need or not os.path.isdir(path):
    return
  free = shutil.disk_usage(path).free
  if need > free:
    clips = 2 * data.worker_buffer + 2
    clip_kib = need / data.workers / clips / 1024
    raise errors.ConfigError(
        f"data: {path} has {free / 2**20:,.0f} MiB free, but the "
        f"{data.workers} data workers can hold {need / 2**20:,.0f} MiB of "
        f"decoded clips there ({data.workers} workers x {clips} clips of "
        f"{clip_kib:,.0f} KiB). Lower --config.data.worker_buffer or "
        "--config.data.workers (or use --config.data.threads instead), or "
        "give the machine a larger /dev/shm (in a container: docker run "
        "--shm-size=...).")


def _mark_flags_parsed(worker_index: int = 0, worker_count: int = 1) -> None:
  # Grain reads absl flags in the parent and in its spawned workers; outside
  # an absl app (notebooks, tests) they were never parsed, which raises
  # UnparsedFlagAccessError. Defaults are what we want: mark them parsed.
  del worker_index, worker_count
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def make_dataset(loader: source.ClipLoader, *, train: bool, seed: int,
                 num_epochs: int | None = None, workers: int = 0,
                 threads: int = 0, worker_buffer: int = 8,
                 process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The Grain graph of this process's clips, one element at a time.

  Args:
    loader: element loader over the records.
    train: shuffle, repeat, random augmentation; else every (record, view)
      once in order.
    seed: shuffle and augmentation seed.
    num_epochs: training epochs (None: forever).
    workers, threads, worker_buffer: parallelism (see module docstring).
    process_index, process_count: this process's share of every batch.
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
  ds = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=threads, prefetch_buffer_size=max(2 * threads, 1)))
  if workers > 0:
    _mark_flags_parsed()
    ds = grain.experimental.WithOptionsIterDataset(
        ds, grain.experimental.DatasetOptions(min_shm_size=MIN_SHM_BYTES))
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
  check_shared_memory(data)
  loader = source.ClipLoader(
      records, data.root, clip_spec(data), tokenizer,
      max_attempts=data.max_attempts,
      positives=caption_positives(data, records) if train else None)
  ds = make_dataset(
      loader, train=train, seed=config.seed if seed is None else seed,
      num_epochs=num_epochs, workers=data.workers, threads=data.threads,
      worker_buffer=data.worker_buffer, process_index=jax.process_index(),
      process_count=jax.process_count())
  return Pipeline(ds, batch_size // jax.process_count(), train,
                  data.max_skip_fraction, mesh, data.device_prefetch)


class Pipeline(sharding.DevicePrefetcher):
  """Device batches plus the state needed to resume them exactly."""

  def __init__(self, dataset: grain.IterDataset, local_batch: int,
               train: bool, max_skip_fraction: float, mesh, prefetch: int,
               state=None):
    self._args = (dataset, local_batch, train, max_skip_fraction, mesh,
                  prefetch)
    self.host = HostBatches(iter(dataset), local_batch, max_skip_fraction,
                            drop_remainder=train)
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

