"""Checkpoints with Orbax, their layout and the write side (`Checkpointer`).

Layout: `WORKDIR/checkpoints/<step>/` with three items:

* `state`: the train state pytree (params + optimizer state), possibly
  sharded; restored straight into the target shardings.
* `data`: the data iterator's state, one JSON file per process
  (`process_<i>-of-<n>.json`), since every process reads its own shard.
* `meta`: JSON with the step, the RNG key and run metadata (the config).

Saves are asynchronous: `save` returns once the arrays are copied off the
devices, and the files are written in the background. Orbax writes into
`<step>.orbax-checkpoint-tmp*` and renames when complete, so a run killed
mid-save leaves a temporary directory that is never picked up; the next
`Checkpointer` on the directory deletes it (Orbax's
`cleanup_tmp_directories`). Just before
the rename, process 0 lists every file of the step with its checksum
(`vidjax.checkpoints.checksums`), which the restore verifies (`vidjax.checkpoints.checkpoint_reader`,
which reads what is written here). A
save that fails (a full disk, no permission) raises `errors.WriteError` at
the next call of `save` (each step of the loop), `wait_until_finished` or
`close`, naming the cause and the last checkpoint saved whole; its
temporary directory is removed.

Best checkpoint: with `checkpoint.best_metric` set (a metric name as in
metrics.jsonl, e.g. 'eval/mAP_avg') each evaluation that improves it is
saved and recorded in `checkpoints/best.json`; that step outlives
`checkpoint.keep`, and `init_from=WORKDIR` loads it
(`checkpoint_reader.read_params`).
Where a run starts, and how it stops to resume: `vidjax.checkpoints.resume`.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shutil
from typing import Any

from absl import logging
from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from vidjax.base import errors, internals, rundir
from vidjax.checkpoints import checksums, failed_saves
from vidjax.config import defaults

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a save in progress.


# ---------------------------------------------------------------------------
# Data iterator state: one JSON file per process.
# ---------------------------------------------------------------------------
def _process_file(directory: epath.Path) -> epath.Path:
  return (
    directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
  )


class _IteratorStateHandler(ocp.CheckpointHandler):
  """Orbax handler writing this process's iterator state as JSON.

  Grain's own handler calls `get_state()` on the live iterator at save
  time, which is wrong once batches are prefetched; this one saves the
  dict it is given (e.g. `DevicePrefetcher.get_state()` in `vidjax.data`).
  """

  def save(self, directory: epath.Path, args: IteratorStateSave):
    _process_file(directory).write_text(json.dumps(args.state))

  def restore(self, directory: epath.Path, args: IteratorStateRestore = None):
    path = _process_file(directory)
    if not path.exists():
      found = sorted(p.name for p in directory.iterdir())
      raise errors.WorkdirError(
        f"{path} is missing (found {found}): the checkpoint was written by "
        "a different number of processes; resume with the same number"
      )
    return json.loads(path.read_text())


@ocp.args.register_with_handler(_IteratorStateHandler, for_save=True)
@dataclasses.dataclass
class IteratorStateSave(ocp.args.CheckpointArgs):
  state: Any


@ocp.args.register_with_handler(_IteratorStateHandler, for_restore=True)
@dataclasses.dataclass
class IteratorStateRestore(ocp.args.CheckpointArgs):
  pass


# ---------------------------------------------------------------------------
# RNG keys as JSON (typed `jax.random.key` or legacy uint32 keys).
# ---------------------------------------------------------------------------
def _rng_to_json(rng) -> dict:
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return {
      "impl": str(jax.random.key_impl(rng)),
      "data": np.asarray(jax.random.key_data(rng)).tolist(),
    }
  return {"impl": None, "data": np.asarray(rng).tolist()}


# ---------------------------------------------------------------------------
# Saving.
# ---------------------------------------------------------------------------
def _state_writer() -> ocp.PyTreeCheckpointHandler:
  """Orbax's pytree handler for the state, less replica-parallel saving.

  Unless JAX_PLATFORMS names a GPU, Orbax's `jax.Array` handler has each
  replica of a replicated array write a slice, cut by a jitted slice on its
  device: an XLA compilation per array shape and device, seconds on a
  process's first save, for nothing when one host holds every replica. Here
  each shard is written whole by its first replica, as Orbax does on GPUs.
  The global registry (a user's own Orbax code shares it) is left alone.
  Same format (`checkpoint_reader` reads it); a replicated array's chunks
  are whole shards.
  """
  default = ocp.type_handlers.get_type_handler(jax.Array)
  array = ocp.type_handlers.ArrayHandler(
    use_replica_parallel=False,
    # The default handler's per-array metadata store (no public accessor;
    # tests/test_layers.py pins it): the same `array_metadatas` files.
    array_metadata_store=internals.array_metadata_store(default),
  )
  handlers = [
    (ty, array if ty is jax.Array else ocp.type_handlers.get_type_handler(ty))
    for ty in ocp.type_handlers.supported_types()
  ]
  return ocp.PyTreeCheckpointHandler(
    type_handler_registry=ocp.type_handlers.create_type_handler_registry(
      *handlers
    )
  )


def manager(
  directory,
  options: ocp.CheckpointManagerOptions,
  state_handler: ocp.CheckpointHandler,
) -> ocp.CheckpointManager:
  """An Orbax manager of a checkpoints directory with the three items."""
  return ocp.CheckpointManager(
    epath.Path(directory),
    options=options,
    item_handlers={
      "state": state_handler,
      "data": _IteratorStateHandler(),
      "meta": ocp.JsonCheckpointHandler(),
    },
  )


class Checkpointer:
  """Saves every `every_steps` (and on demand), keeps the last `keep`.

  Usage:
    ckpt = Checkpointer(rundir.checkpoints(workdir), every_steps=1000, keep=3,
                        metadata={"config": config.to_dict()})
    ...
    ckpt.save(step, state, data_state=batches.get_state(), rng=rng)
    ckpt.record_eval(step, eval_metrics, state)  # keeps the best (best_metric)
    ...
    ckpt.close()  # waits for the last asynchronous save
  """

  def __init__(
    self,
    directory,
    *,
    every_steps: int,
    keep: int | None = 3,
    async_save: bool = True,
    metadata: dict | None = None,
    best_metric: str = "",
    best_mode: str = "max",
  ):
    if every_steps <= 0:
      raise errors.ConfigError(
        f"checkpoint.every_steps must be > 0, got {every_steps}"
      )
    if best_mode not in defaults.BEST_MODES:
      raise errors.ConfigError(
        f"checkpoint.best_mode must be one of "
        f"{defaults.BEST_MODES}, got {best_mode!r}"
      )
    self.directory = epath.Path(directory)
    self.every_steps = every_steps
    self._metadata = metadata or {}
    self.best_metric, self.best_mode = best_metric, best_mode
    self._warned_no_metric = False
    self._async = async_save
    self._in_flight: int | None = None  # The step being written, if any.
    if jax.process_count() > 1:
      # Other processes may still be checking whether this directory exists
      # (resolve_start); creating it first would desync Orbax's barriers.
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("vidjax:Checkpointer")
    # The save policy is ours (`should_save`); Orbax only keeps the last K
    # (and the best step, when one is tracked).
    keeping = {"max_to_keep": keep}
    if keep and best_metric:
      policies = ocp.checkpoint_managers
      keeping = {
        "preservation_policy": policies.AnyPreservationPolicy(
          [policies.LatestN(n=keep), _KeepBest(self)]
        )
      }
    # Always Orbax's asynchronous path, for its hook between the last file
    # and the commit; `async_save=False` waits for each save. Directories
    # are made before `save` returns: one that cannot be made (no
    # permission) fails that save, without threads left waiting for it.
    self._mngr = manager(
      self.directory,
      ocp.CheckpointManagerOptions(
        create=True,
        cleanup_tmp_directories=True,
        enable_async_checkpointing=True,
        async_options=ocp.AsyncOptions(
          post_finalization_callback=self._before_commit,
          create_directories_asynchronously=False,
        ),
        **keeping,
      ),
      _state_writer(),
    )
    self.best = (
      best_record(self.directory, self._mngr.all_steps())
      if best_metric
      else None
    )
    if self.best and (self.best["metric"], self.best["mode"]) != (
      best_metric,
      best_mode,
    ):
      self.best = None  # Another metric now: start the record over.

  @classmethod
  def from_config(cls, workdir, config, **kwargs) -> Checkpointer:
    """Reads `checkpoint.every_steps`, `.keep`, `.async_save`,
    `.best_metric` ('' = none) and `.best_mode` ('max' or 'min')."""
    ck = config.checkpoint
    return cls(
      rundir.checkpoints(workdir),
      every_steps=ck.every_steps,
      keep=ck.keep,
      async_save=ck.async_save,
      best_metric=ck.best_metric,
      best_mode=ck.best_mode,
      **kwargs,
    )

  def should_save(self, step: int) -> bool:
    return step > 0 and step % self.every_steps == 0

  def save(
    self,
    step: int,
    state: Any,
    *,
    data_state: Any = None,
    rng=None,
    force: bool = False,
  ) -> bool:
    """Saves if `should_save(step)` or `force`; returns whether it did.

    Args:
      step: number of optimizer steps taken (resuming starts here).
      state: train state pytree of jax arrays (sharded or not).
      data_state: JSON-able iterator state *before* the first unconsumed
        batch (see `data.prefetch.DevicePrefetcher.get_state`).
      rng: a PRNG key (typed or legacy uint32), restored as given.
      force: save even off the schedule (preemption, end of training).

    Raises:
      errors.WriteError: this save, or the one before it (written in the
        background), failed. Call `save` every step: a background failure
        is raised at the first call after it.
    """
    self._raise_if_failed(wait=False)
    if not (force or self.should_save(step)):
      return False
    if step in self._mngr.all_steps():
      return False  # e.g. a forced save right after a scheduled one
    meta = {"step": step, "metadata": self._metadata}
    if rng is not None:
      meta["rng"] = _rng_to_json(rng)
    items = {
      "state": ocp.args.PyTreeSave(state),
      "meta": ocp.args.JsonSave(meta),
    }
    if data_state is not None:
      items["data"] = IteratorStateSave(data_state)
    self._raise_if_failed(wait=True)  # The previous save, whole, first.
    self._in_flight = step
    try:
      saved = self._mngr.save(
        step, args=ocp.args.Composite(**items), force=True
      )
    except Exception as e:
      self._report_failure(step, e)
    if saved:
      logging.info("checkpoint: saving step %d to %s", step, self.directory)
    if not self._async:
      self._raise_if_failed(wait=True)
    return saved

  def _before_commit(self):
    """Process 0, in Orbax's save thread, once every process's files are
    written and before the step is renamed into place: the checksums."""
    final = self.directory / str(self._in_flight)
    tmp = self.directory / f"{final.name}{TMP_SUFFIX}"
    checksums.write(tmp if tmp.is_dir() else final)

  def _raise_if_failed(self, *, wait: bool):
    """Raises the failure of the save in flight, if it failed.

    Args:
      wait: wait for it to finish; else only look if it has finished.
    """
    step = self._in_flight
    if step is None or not wait and self._mngr.is_saving_in_progress():
      return
    try:
      self._mngr.wait_until_finished()  # (`_before_commit` reads the step.)
    except Exception as e:
      self._report_failure(step, e)
    self._in_flight = None

  def _report_failure(self, step: int, error: Exception):
    """Raises a failed save's error: a `WriteError` if the system refused a
    write (a full disk), else `error` itself (a bug). What the save wrote is
    removed."""
    self._in_flight = None
    if jax.process_index() == 0:  # It would only fill the disk.
      shutil.rmtree(
        os.fspath(self.directory / f"{step}{TMP_SUFFIX}"), ignore_errors=True
      )
    cause = failed_saves.cause(error)
    # Files gone under the save: TensorStore says NOT_FOUND, or Orbax fails
    # on the metadata it can no longer read back (its own ValueError; its
    # writes may have made the directories again by then).
    deleted = (
      cause == os.strerror(errno.ENOENT)
      or internals.is_not_found(error)
      or internals.is_orbax_metadata_gone(error)
      or not self.directory.is_dir()
    )
    if cause is None and not deleted:
      raise error
    if deleted:
      raise errors.WriteError(
        f"could not save the checkpoint of step {step} in {self.directory}: "
        "files of the save were deleted while it was being written (the "
        "workdir removed or moved?)",
        hint="put the workdir back and run the same command to resume from "
        "its last checkpoint, or run it on an empty workdir to start again",
      ) from None
    steps = [s for s in self._mngr.all_steps() if s != step]
    last = (
      f"the last checkpoint saved whole is step {max(steps)}"
      if steps
      else "no checkpoint was saved whole yet"
    )
    raise errors.WriteError(
      f"could not save the checkpoint of step {step} in {self.directory}: "
      f"{cause}; {last}",
      hint=errors.WRITE_HINT,
    ) from None

  def record_eval(
    self, step: int, metrics: dict, state: Any, **save_kwargs
  ) -> bool:
    """After an evaluation: a new best `best_metric` is saved and recorded.

    Args:
      step: the evaluated step.
      metrics: the evaluation's metrics (names as in metrics.jsonl).
      state: the train state at `step` (saved if the step has no checkpoint).
      **save_kwargs: `save`'s data_state and rng.

    Returns:
      Whether `step` is the new best (strictly better than the record).
    """
    if not self.best_metric:
      return False
    value = metrics.get(self.best_metric)
    if value is None:
      if not self._warned_no_metric:
        logging.warning(
          "checkpoint.best_metric=%r is not among the evaluation's "
          "metrics (%s): no best checkpoint is recorded",
          self.best_metric,
          ", ".join(sorted(metrics)),
        )
        self._warned_no_metric = True
      return False
    value = float(value)
    if (
      math.isnan(value)
      or self.best is not None
      and not (
        value > self.best["value"]
        if self.best_mode == "max"
        else value < self.best["value"]
      )
    ):
      return False  # Not better, or NaN.
    # The record first, so that this save's clean-up keeps it (and may let
    # the previous best go).
    self.best = {
      "metric": self.best_metric,
      "mode": self.best_mode,
      "step": step,
      "value": value,
    }
    self.save(step, state, force=True, **save_kwargs)
    path = self.directory / rundir.BEST_JSON
    try:
      rundir.write_json(path, self.best)
    except OSError as e:
      raise errors.WriteError(
        f"could not write {path}: {e.strerror or e}", hint=errors.WRITE_HINT
      ) from None
    logging.info(
      "checkpoint: step %d is the best so far (%s = %.4g)",
      step,
      self.best_metric,
      value,
    )
    return True

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def wait_until_finished(self):
    """Waits for the save in flight. Raises `errors.WriteError` if it failed."""
    self._raise_if_failed(wait=True)

  def close(self):
    """Waits for the save in flight and releases Orbax's resources.

    Raises:
      errors.WriteError: the save in flight failed. Used as a context, this
        replaces an error already on its way out (which a full disk, say,
        may have caused).
    """
    try:
      self._raise_if_failed(wait=True)
    finally:
      try:
        self._mngr.close()
      except Exception:
        pass  # A failed save, raised above or before.

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class _KeepBest:
  """Orbax preservation policy: keeps the checkpointer's best step.

  Not Orbax's `BestN` with `save(metrics=)`: Orbax takes a step's metrics
  when it saves the step, but a run saves a step (on schedule, or as a
  stop point) before it evaluates it, and saves an evaluated step only if
  it is the best. BestN would need an evaluation before every save of an
  evaluated step (a kill during it losing the step) and a save of every
  evaluated step, and runs saved before would still need best.json read.
  """

  def __init__(self, checkpointer: Checkpointer):
    self._checkpointer = checkpointer

  def should_preserve(self, checkpoints, *, context=None):
    del context
    best = self._checkpointer.best
    return [best is not None and c.step == best["step"] for c in checkpoints]


def best_record(directory, steps) -> dict | None:
  """The record of `directory/best.json` if it names one of `steps`.

  Returns:
    {"metric", "mode", "step", "value"}, or None (no record, not valid
    JSON, or its step is not among `steps`: not complete).
  """
  path = epath.Path(directory) / rundir.BEST_JSON
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
  except ValueError:
    logging.warning("%s is not valid JSON: ignored", path)
    return None
  return record if record.get("step") in steps else None
