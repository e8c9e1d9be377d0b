"""Reading the checkpoints `vidjax.checkpoints.checkpoint.Checkpointer` writes.

`RunCheckpoints(directory)` opens a checkpoints directory once (one
read-only Orbax manager) and answers everything start-up asks of it, each
read once: its complete steps, a step's saved config, RNG key and array
shapes (its metadata, reading no array), the best step (`best.json`),
whether a step's files are intact (`vidjax.checkpoints.checksums`), and the restore.
The restore verifies the arrays' files while it reads them: the checksums
run beside Orbax's reads, so the files come from the disk once and the
verification costs little more than the restore (`python -m
benchmarks.checkpoint`); a step found damaged raises `Damaged` and its
restored arrays are dropped.

    with RunCheckpoints(rundir.checkpoints(workdir)) as ckpts:
      step = ckpts.steps()[0]
      ckpts.config(step), ckpts.shapes(step)  # {dotted path: shape}
      restored = ckpts.restore(step, target)  # Damaged: another step

The module's functions read one thing each (`read_params`: the parameters
of a run, for `init_from`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from typing import Any

from absl import logging
from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from vidjax.base import errors, internals, keypaths
from vidjax.checkpoints import checkpoint, checksums


class Damaged(Exception):
  """A step's files are not those saved: `problem` says what is wrong."""

  def __init__(self, step: int, problem: str):
    super().__init__(problem)
    self.step, self.problem = step, problem


@dataclasses.dataclass
class Restored:
  """What a checkpoint holds. `data_state`/`rng` are None if not saved."""

  step: int
  state: Any
  data_state: Any
  rng: Any
  metadata: dict


def _abstract(target: Any) -> Any:
  """Arrays -> ShapeDtypeStruct keeping their sharding (restore target)."""

  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    return jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=getattr(x, "sharding", None)
    )

  return jax.tree.map(one, target)


def _rng_from_json(blob: dict):
  data = np.asarray(blob["data"], dtype=np.uint32)
  if blob["impl"] is None:
    return jax.numpy.asarray(data)
  return jax.random.wrap_key_data(data, impl=blob["impl"])


def tree_shapes(tree) -> dict[str, tuple]:
  """{dotted path: shape} of a pytree of arrays or ShapeDtypeStructs."""
  return {
    keypaths.name(p): tuple(x.shape)
    for p, x in jax.tree_util.tree_leaves_with_path(tree)
  }


class RunCheckpoints:
  """A checkpoints directory opened for reading, once (a context).

  Each answer is read once and kept: a step's metadata, its shapes, the
  best record. A directory that does not exist has no steps.
  """

  def __init__(self, directory):
    self.directory = epath.Path(directory)
    self._mngr = None
    self._steps = []
    if self.directory.is_dir():  # (epath: URLs too.)
      self._mngr = checkpoint.manager(
        self.directory,
        ocp.CheckpointManagerOptions(read_only=True),
        ocp.StandardCheckpointHandler(),
      )
      self._steps = sorted(self._mngr.all_steps(), reverse=True)
    self._meta: dict[int, dict] = {}
    self._shapes: dict[int, dict] = {}
    self._best = ...

  def steps(self) -> list[int]:
    """The finalised steps, newest first ([] if none).

    Temporary (half-written) step directories are not counted; whether a
    step's files are intact is `verify`'s to say.
    """
    return list(self._steps)

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def meta(self, step: int) -> dict:
    """The step's `meta` item: {"step", "metadata": {"config": ...},
    "rng"} ({} for a step without one)."""
    if step not in self._meta:
      if not (self.step_dir(step) / "meta").is_dir():
        self._meta[step] = {}
      else:
        self._meta[step] = dict(
          self._mngr.restore(
            step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
          )["meta"]
        )
    return self._meta[step]

  def config(self, step: int) -> dict:
    """The config the step was saved with, as a dict ({} if none was)."""
    return self.meta(step).get("metadata", {}).get("config", {})

  def shapes(self, step: int) -> dict[str, tuple]:
    """{dotted path: shape} of the step's state, from its metadata."""
    if step not in self._shapes:
      self._shapes[step] = tree_shapes(self._mngr.item_metadata(step)["state"])
    return self._shapes[step]

  def best(self) -> dict | None:
    """The best-checkpoint record if it names a complete step, else None:
    {"metric", "mode", "step", "value"}."""
    if self._best is ...:
      self._best = checkpoint.best_record(self.directory, self._steps)
    return self._best

  def verify(self, step: int, part: str | None = None) -> str | None:
    """What is wrong with the step's files, or None (`checksums.verify`;
    `part`: 'metadata' or 'arrays', else every file)."""
    return checksums.verify(self.step_dir(step), part=part)

  def restore(self, step: int, target: Any, *, verify: bool = True) -> Restored:
    """Restores a step onto `target`'s shardings, verifying its arrays.

    Args:
      step: a complete step.
      target: pytree like the saved state: arrays or
        `jax.ShapeDtypeStruct`s whose `.sharding` says where each restored
        array goes.
      verify: check the arrays' files against their checksums while they
        are read (the rest of the step: `verify(step, 'metadata')`).

    Raises:
      Damaged: the arrays' files are not those saved (what the restore
        read is dropped; its own error, if it failed on them, too).
    """
    items = {"state": ocp.args.StandardRestore(_abstract(target))}
    has_data = (self.step_dir(step) / "data").exists()
    if has_data:
      items["data"] = checkpoint.IteratorStateRestore()
    meta = dict(self.meta(step))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      checking = pool.submit(self.verify, step, "arrays") if verify else None
      try:
        out, failure = (
          self._mngr.restore(step, args=ocp.args.Composite(**items)),
          None,
        )
      except Exception as e:
        out, failure = None, e
      problem = checking.result() if checking else None
    if problem:
      del out
      raise Damaged(step, problem)
    if failure is not None:
      raise failure
    rng = meta.pop("rng", None)
    return Restored(
      step=step,
      state=out["state"],
      data_state=out["data"] if has_data else None,
      rng=None if rng is None else _rng_from_json(rng),
      metadata=meta.get("metadata", {}),
    )

  def close(self):
    if self._mngr is not None:
      self._mngr.close()
      self._mngr = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def complete_steps(directory) -> list[int]:
  """The finalised steps in `directory`, newest first ([] if none)."""
  with RunCheckpoints(directory) as ckpts:
    return ckpts.steps()


def latest_complete_step(directory) -> int | None:
  """Latest finalised checkpoint step in `directory`, None if none/absent."""
  return next(iter(complete_steps(directory)), None)


def read_best(directory) -> dict | None:
  """The best-checkpoint record of a checkpoints directory, or None (see
  `RunCheckpoints.best`)."""
  with RunCheckpoints(directory) as ckpts:
    return ckpts.best()


def restore_checkpoint(
  directory, target: Any, *, step: int | None = None
) -> Restored:
  """Restores a step (default: the latest complete one) onto `target`'s
  shardings, its files not verified (`RunCheckpoints.restore` verifies)."""
  with RunCheckpoints(directory) as ckpts:
    step = next(iter(ckpts.steps()), None) if step is None else step
    if step is None:
      raise FileNotFoundError(f"no complete checkpoint in {directory}")
    return ckpts.restore(step, target, verify=False)


@contextlib.contextmanager
def _without_item_metadata_warning():
  """Orbax's warning that a step's item has no metadata file, which reading
  one item of a step (its directory `state`) gives every time."""

  def keep(record) -> bool:
    return not internals.is_orbax_item_metadata_warning(record)

  absl_logger = logging.get_absl_logger()
  absl_logger.addFilter(keep)
  try:
    yield
  finally:
    absl_logger.removeFilter(keep)


def read_params(directory, step: int) -> tuple[dict[str, np.ndarray], dict]:
  """One checkpoint's parameters as host arrays, and the run's config.

  Only `state["params"]` is read (an Orbax partial restore): not the
  optimizer state, the data iterator or the step.

  Args:
    directory: a checkpoints directory (`WORKDIR/checkpoints`).
    step: a complete step in it.

  Returns:
    ({dotted parameter path: numpy array}, the config dict saved with it, or
    {} if none was saved), e.g. {"visual.blocks.layers.0.norm1.scale": ...}.
  """
  step_dir = epath.Path(directory) / str(step)
  with (
    _without_item_metadata_warning(),
    ocp.PyTreeCheckpointer() as checkpointer,
  ):
    tree = checkpointer.metadata(step_dir / "state")
    tree = getattr(tree, "item_metadata", tree)  # Orbax versions differ.
    tree = getattr(tree, "tree", tree)
    if "params" not in tree:
      raise errors.InitFromError(
        f"{step_dir}: the saved state has no 'params' "
        f"(it has {sorted(tree)}); not a vidjax checkpoint"
      )
    item = {"params": tree["params"]}
    as_numpy = jax.tree.map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item
    )
    restored = checkpointer.restore(
      step_dir / "state",
      args=ocp.args.PyTreeRestore(
        item=item, restore_args=as_numpy, partial_restore=True
      ),
    )
  params = {}
  for path, value in jax.tree_util.tree_flatten_with_path(restored["params"])[
    0
  ]:
    params[keypaths.name(path)] = value
  return params, read_config(directory, step)


def read_config(directory, step: int) -> dict:
  """The config a checkpoint was saved with, as a dict ({} if none was)."""
  meta_dir = epath.Path(directory) / str(step) / "meta"
  if not meta_dir.is_dir():
    return {}
  with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
    meta = checkpointer.restore(meta_dir)
  return meta.get("metadata", {}).get("config", {})
