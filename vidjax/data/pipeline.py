"""The Grain graph: records -> per-process uint8 batches -> global device arrays.

    records --range/shuffle/repeat--> element ids (evaluation: padded to
                                      whole global batches)
            --random_map(loader.ClipLoader)--> decoded clips (workers, threads)
            --slice per process, group--> this process's clips, a few at a time
            --batches.HostBatches: skip accounting--> local batches
            --prefetch.DevicePrefetcher--> global jax.Arrays on the batch axis

Workers hand the main process groups of a few clips (`clips_per_transfer`:
at most `TRANSFER_BYTES` of frames, a divisor of the local batch), never
whole batches: each clip is decoded into a /dev/shm block of its worker's,
which the main process copies into the batch and frees at once for the
worker to reuse (`vidjax.data.workers`). What sits in /dev/shm is therefore
a few groups per worker (`shared_memory_bytes`), whatever the global batch; a batch of 2048 clips
built inside each of 16 workers could hold tens of GB there and kill a
container with a small /dev/shm (SIGBUS). `make_pipeline` checks the room at
start-up. Groups rather than single clips: each hand-over costs both
processes a fixed amount of work (`python -m benchmarks.pipeline` shows
the CPU it takes).

Per-element randomness comes from Grain's per-element seeds (seed + element
index), and workers' clips are interleaved in element order, so the batches
are the same whatever the number of workers or threads. The iterator state
(the position in clips plus the skip counters) is captured after each batch
actually handed to the caller; `make_pipeline(..., state=...)` builds a
pipeline whose stream starts there, which reproduces the following batches
exactly, also with other `workers` or `threads`.

While no batch comes, a warning every `data.stall_warn_s` seconds names
what the pipeline waits on: the worker whose turn it is (its pid, and its
state: stopped, blocked on IO, ...) and the chunk files it reads. A worker
that dies raises `errors.DataWorkerDied`, saying which and how
(`vidjax.data.workers`).

Config keys (`config.data`; defaults: `vidjax.config.defaults.data_config`):
  root            chunk store (written by `python -m vidjax.data.chunk`)
  train_annotations / eval_annotations   annotation files; several training
                  files separated by commas are concatenated (LaViLa's
                  rephraser + narrator narrations)
  format          jsonl | ego4d | ek100_cls | ek100_mir | kinetics |
                  kinetics_list | egomcq | egtea | charades_ego |
                  charades_ego_trimmed (see `vidjax.data.annotations`); the
                  `kinetics` class ids are the training classes, sorted
                  (`vidjax.data.annotations.annotation_files`)
  classes         EGTEA's action_idx.txt or Charades_v1_classes.txt ('':
                  the one beside the annotation file, as released)
  label           for ek100_cls: action | verb | noun
  allow_pickle    let `ego4d` / relevancy loaders unpickle (runs code!)
  train_sentences, train_relevancy   EK-100 MIR training positives: each
                  clip is paired with a caption of the sentence CSV drawn
                  among those of relevancy > positive_threshold to it (AVION)
  positive_threshold  0.1
  max_nouns       noun classes per clip or caption in the batches of a
                  relevancy-aware loss (`loss.name`; the in-batch relevancy
                  from the classes: `vidjax.data.annotations.ek100_classes`)
  vocab           CLIP BPE vocabulary (bpe_simple_vocab_16e6.txt.gz) for text
  num_frames, sampling, stride, size, crop, crop_scale, hflip,
  eval_clips, eval_crops                 see `loader.ClipSpec`
  repeats         training views per decoded clip (R, 1: off): the host
                  decodes batch_size / R clips a step, each its centred
                  `repeat_canvas` (H, W) window (default (0, 0): 8/7 of
                  `size`, aspect 5:4, `loader.canvas_size`; the centre of
                  wider frames is kept), and the train step crops,
                  flips and augments R views of each (`vidjax.augment.views`);
                  VideoMAE and classification only
  workers         Grain worker processes (0: in the main process)
  threads         reader threads per process (PyAV releases the GIL)
  stall_warn_s    seconds without a batch between warnings of what it waits on
  worker_buffer   clips buffered per worker (and as many on the main side)
  device_prefetch batches in flight to the devices
  max_skip_fraction  stop when more than this share of reads failed
  max_attempts    reads per training element before giving up on it
  max_bad_row_fraction  stop at start-up when more than this share of an
                  annotation file's rows are bad (`vidjax.data.checks`)
  synthetic       the synthetic corpus used when no data path is set
                  (`enabled`, its size and `seed`; `vidjax.data.synthetic`)

A failed read is logged when a file fails for the first time (once per
file and process), counted per file (`Pipeline.failures`), and the
`DataError` past `max_skip_fraction` lists each bad file once with its count.
"""

from __future__ import annotations

import collections
import os
import shutil

import grain
import jax
import ml_collections

from vidjax.base import errors
from vidjax.data import (
  batches,
  loader,
  order,
  prefetch,
  reads,
  video,
  workers as workers_lib,
)
from vidjax.data.annotations import annotation_files, ek100_classes

SHM_DIR = workers_lib.SHM_DIR
# The most frames a worker hands over at once (see the module docstring).
TRANSFER_BYTES = 32 * 2**20


def clip_bytes(data: ml_collections.ConfigDict, train: bool = False) -> int:
  """Bytes of one decoded clip: uint8[num_frames, height, width, 3] (in
  training with `repeats` > 1, the canvas's size)."""
  height, width = loader.ClipSpec.from_config(data, train=train).size
  return data.num_frames * height * width * 3


def clips_per_step(data: ml_collections.ConfigDict, batch_size: int) -> int:
  """Clips the host decodes for a training batch of `batch_size` views:
  `batch_size / data.repeats` (`vidjax.augment.views` makes the views)."""
  repeats = data.get("repeats", 1)
  if batch_size % repeats:
    raise ValueError(
      f"batch size {batch_size} is not a multiple of data.repeats={repeats}"
    )
  return batch_size // repeats


def clips_per_transfer(
  data: ml_collections.ConfigDict, local_batch: int, train: bool = False
) -> int:
  """Clips a worker hands over at once: the largest divisor of the local
  batch whose frames fit in `TRANSFER_BYTES` (at least 1), so that every
  batch is made of whole groups."""
  most = max(1, TRANSFER_BYTES // clip_bytes(data, train))
  return max(
    g for g in range(1, min(most, local_batch) + 1) if local_batch % g == 0
  )


def _buffered_groups(worker_buffer: int, group: int) -> int:
  """Grain's per-worker buffer, in groups: `worker_buffer` clips' worth."""
  return -(-worker_buffer // group)


def shared_memory_bytes(
  data: ml_collections.ConfigDict, local_batch: int, train: bool = False
) -> int:
  """The most /dev/shm the workers' clips can take at once (0: no workers).

  Per worker: `worker_buffer` clips (in whole groups of
  `clips_per_transfer`) in its queue and as many read ahead by the main
  process, one group being handed over on each side, and the next being
  decoded (each clip is in its block from its first frame on): the most
  blocks (one a clip) a worker can have in use at once, so the most it
  keeps. Only the frames go through /dev/shm
  (`workers_lib.MIN_SHM_BYTES`).
  """
  if not data.workers:
    return 0
  group = clips_per_transfer(data, local_batch, train)
  groups = data.workers * (2 * _buffered_groups(data.worker_buffer, group) + 3)
  return groups * group * (clip_bytes(data, train) + workers_lib.SLOT_HEADER)


def check_shared_memory(
  data: ml_collections.ConfigDict,
  local_batch: int,
  path: str = SHM_DIR,
  train: bool = False,
) -> None:
  """Stops at start-up, saying what to change, if /dev/shm is too small."""
  need = shared_memory_bytes(data, local_batch, train)
  if not need or not os.path.isdir(path):
    return
  free = shutil.disk_usage(path).free
  if need > free:
    raise errors.ConfigError(
      f"data: {path} has {free / 2**20:,.0f} MiB free, but the "
      f"{data.workers} data workers can hold {need / 2**20:,.0f} MiB of "
      f"decoded clips there ({need // clip_bytes(data, train)} clips of "
      f"{clip_bytes(data, train) / 1024:,.0f} KiB). Lower "
      "--config.data.worker_buffer or --config.data.workers (or use "
      "--config.data.threads instead), or give the machine a larger "
      "/dev/shm (in a container: docker run --shm-size=...)."
    )


def train_elements(
  clip_loader: loader.ClipLoader, seed: int, num_epochs: int | None = None
) -> grain.MapDataset:
  """The training stream's clips, element by element (before the slice per
  process and the groups): the records shuffled each epoch, each element
  loaded with its own generator (seed and element index)."""
  ds = order.EpochShuffle(
    grain.MapDataset.range(len(clip_loader.records)), seed=seed
  )
  return ds.repeat(num_epochs).random_map(clip_loader.train_element, seed=seed)


def make_dataset(
  clip_loader: loader.ClipLoader,
  *,
  train: bool,
  seed: int,
  num_epochs: int | None = None,
  workers: workers_lib.Workers | None = None,
  threads: int = 0,
  worker_buffer: int = 8,
  batch_size: int = 1,
  group: int = 1,
  process_index: int = 0,
  process_count: int = 1,
  start: int = 0,
) -> grain.IterDataset:
  """The Grain graph of this process's clips, `group` clips per element.

  Args:
    clip_loader: element loader over the records.
    train: shuffle, repeat, random augmentation; else every (record, view)
      once in order, then invalid padding up to whole global batches.
    seed: shuffle and augmentation seed.
    num_epochs: training epochs (None: forever).
    workers, threads, worker_buffer: parallelism (see module docstring):
      the worker processes (None: none), reader threads, and the clips
      buffered per worker.
    batch_size: this process's batch size (evaluation's padding).
    group: clips per element (`clips_per_transfer`, a divisor of
      `batch_size`): each element is the clips' dict with a leading axis of
      `group`, e.g. video uint8[group, T, H, W, 3], errors str[group].
    process_index, process_count: this process's share of every batch.
    start: the group this process's stream starts at (a resumed run's
      `batches.resume_group`).
  """
  records = len(clip_loader.records)
  if train:
    ds = train_elements(clip_loader, seed, num_epochs)
  else:
    # Every process must yield as many batches, or the evaluation's
    # collectives wait forever for the one that ran out: pad to whole
    # global batches, so each process gets the same number of elements.
    global_batch = batch_size * process_count
    elements = records * clip_loader.spec.views
    ds = grain.MapDataset.range(-(-elements // global_batch) * global_batch)
    ds = ds.map(clip_loader.eval_element)
  # Slicing after the map keeps each element's seed independent of the
  # number of processes.
  # Training drops a short final group (a short batch is dropped anyway);
  # evaluation has whole batches.
  # With workers, the clips cross in the reused /dev/shm blocks they were
  # decoded into, named after this run (no copy in the worker).
  ds = ds[process_index::process_count].batch(
    group,
    drop_remainder=train,
    batch_fn=workers and workers_lib.stack_to_shared_memory,
  )
  # A resumed stream starts at its position: each worker then takes every
  # `workers`-th group of it, so any number of workers resumes there.
  ds = ds[start:] if start else ds
  ds = ds.to_iter_dataset(
    grain.ReadOptions(
      num_threads=threads, prefetch_buffer_size=max(2 * threads, 1)
    )
  )
  if workers is not None:
    workers_lib.mark_flags_parsed()  # Process-wide: absl's FLAGS parsed.
    ds = grain.experimental.WithOptionsIterDataset(
      ds,
      grain.experimental.DatasetOptions(min_shm_size=workers_lib.MIN_SHM_BYTES),
    )
    ds = ds.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=workers.count,
        per_worker_buffer_size=_buffered_groups(worker_buffer, group),
      ),
      worker_init_fn=workers.init_fn(),
    )
  return ds


def make_pipeline(
  config: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  *,
  train: bool,
  batch_size: int,
  tokenizer=None,
  records=None,
  num_epochs: int | None = None,
  seed: int | None = None,
  state: dict | None = None,
  read_clip=video.read_clip,
) -> Pipeline:
  """Global device batches for training or evaluation.

  Args:
    config: the run config (reads `config.data` and `config.seed`).
    mesh: device mesh; batches are sharded over its batch axes.
    train: training (shuffled, augmented, endless unless `num_epochs`) or
      evaluation (each record's views once, padded with invalid elements
      to whole batches, as many on every process; `valid` mask).
    batch_size: GLOBAL batch size; split over processes. In training it
      counts views: the host decodes `clips_per_step` clips a batch (a
      `data.repeats`-th), the train step makes the views.
    tokenizer: `vidjax.data.tokenizer.Tokenizer` for text records.
    records: clip records; default: load the configured annotation file.
    num_epochs: stop after this many epochs (training).
    seed: default `config.seed`.
    state: a `get_state()` of an earlier pipeline of the same config (any
      `data.workers` and `data.threads`): this one starts at the batch that
      one would have yielded next (a resumed run).
    read_clip: the reader of each clip (`vidjax.data.video.read_clip`;
      the pipeline benchmark times it through a stand-in, in the workers).

  Returns:
    A `Pipeline`: an iterator of dicts of `jax.Array` (video
    uint8[B, T, H, W, 3], tokens / label / verb / noun, index, view, valid,
    skipped; in training with repeats, B / R canvases uint8[B / R, T, Hc,
    Wc, 3]) with `get_state()`, whose position counts clips.
  """
  data = config.data
  if train:
    batch_size = clips_per_step(data, batch_size)
  if batch_size % jax.process_count():
    raise ValueError(
      f"batch size {batch_size} does not divide over "
      f"{jax.process_count()} processes"
    )
  path = data.train_annotations if train else data.eval_annotations
  if records is None:
    records = annotation_files.load_annotations(data, path)
  if not records:
    raise errors.DataFileError(f"{path}: no annotation rows")
  local_batch = batch_size // jax.process_count()
  check_shared_memory(data, local_batch, train=train)
  group = clips_per_transfer(data, local_batch, train)
  targets = batches.target_keys(config, train=train)
  pairs = ek100_classes.KEYS[0] in targets
  positives = (
    annotation_files.caption_positives(data, records, pairs=pairs)
    if train
    else None
  )
  clip_loader = loader.ClipLoader(
    records,
    data.root,
    loader.ClipSpec.from_config(data, train=train),
    tokenizer,
    max_attempts=data.max_attempts,
    positives=positives[0] if pairs else positives,
    pairs=positives[1] if pairs else None,
    targets=targets,
    read_clip=read_clip,
  )
  start = batches.resume_group(state, group) if state else 0
  workers = workers_lib.Workers(data.workers) if data.workers else None
  ds = make_dataset(
    clip_loader,
    train=train,
    seed=config.seed if seed is None else seed,
    num_epochs=num_epochs,
    workers=workers,
    threads=data.threads,
    worker_buffer=data.worker_buffer,
    batch_size=local_batch,
    group=group,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    start=start,
  )
  host = batches.HostBatches(
    iter(ds),
    local_batch,
    data.max_skip_fraction,
    train=train,
    group=group,
    state=state,
  )
  return Pipeline(
    host,
    data.device_prefetch,
    mesh,
    workers=workers,
    stall_warn_s=data.stall_warn_s,
    name="training" if train else "evaluation",
  )


class Pipeline(prefetch.DevicePrefetcher):
  """Device batches plus what a run reports about them: skips, failures,
  what a stalled pipeline waits on, and dead workers."""

  FIRST_WAIT_S = 10.0
  STUCK_WAIT_S = 2.0  # Closing after an interrupted wait: for the thread.

  def __init__(
    self,
    host: batches.HostBatches,
    prefetch_size: int,
    mesh,
    *,
    workers: workers_lib.Workers | None = None,
    **kwargs,
  ):
    self.host, self.workers = host, workers
    super().__init__(host, prefetch_size, mesh, **kwargs)

  def next_within(self, timeout: float | None):
    """See `DevicePrefetcher.next_within`.

    Raises:
      errors.DataWorkerDied: a worker process died.
    """
    try:
      return super().next_within(timeout)
    except RuntimeError as e:
      died = self.workers and self.workers.died(e, self._turn())
      if not died:
        raise
      raise died from e

  def _turn(self) -> int:
    """The worker whose group the thread waits for (they take turns)."""
    return (self.host.groups - self.host.start) % self.workers.count

  def waiting_on(self) -> str:
    """The worker whose turn it is, or this process's reads (no workers)."""
    if self.workers is None:
      return f"this process, {reads.describe(reads.in_progress())}"
    return self.workers.describe(self._turn())

  def close(self):
    """Stops the thread, then Grain, then waits for the thread.

    The thread normally finishes the batch it is assembling (the workers
    still run) and stops. One that waits longer than `FIRST_WAIT_S`, or at
    all after an interrupted wait, waits on a stalled read: the workers are
    killed (their clips are not needed any more), which ends it. A read
    stuck in this process (no workers) cannot be stopped: its thread is
    left behind after `STUCK_WAIT_S`.
    """
    self._stop.set()  # The thread then asks Grain for nothing more.
    stopped = self.wait_for_thread(
      0.0 if self.interrupted else self.FIRST_WAIT_S
    )
    if not stopped and self.workers is not None:
      self.workers.kill()  # Grain sees it within a second, and ends the wait.
      self.wait_for_thread(self.STUCK_WAIT_S)
    self.host.close()
    super().close(
      self.STUCK_WAIT_S if self.interrupted else prefetch.CLOSE_TIMEOUT_S
    )
    if self.workers is not None:
      self.workers.close()

  @property
  def skipped(self) -> int:
    """Failed reads so far, as of the batches handed out (`data/skipped`)."""
    state = self.get_state()
    return state["skipped"] if state else 0

  @property
  def failures(self) -> collections.Counter:
    """Failed reads per file so far (including batches still in flight)."""
    return self.host.failures
