"""Where a run starts, and whether its checkpoint fits.

Where a run starts (`resolve_start`): its own latest checkpoint; else
`config.resume` (another run's checkpoints: full state); else
`config.init_from` (parameters only, filled by `vidjax.models.init_from`);
else scratch. Before a checkpoint is restored, `check_fits` compares its
array shapes with the new run's (from the files' metadata, reading no
array) and names the config keys that changed. `remove_partial_saves`
deletes the temporary directories a killed save left. How SIGTERM and
Ctrl-C stop a run so that it resumes: `vidjax.stopping`.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

from vidjax import checkpoint, config as config_lib, errors, keypaths


# ---------------------------------------------------------------------------
# Where to start.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StartPoint:
  """What a run loads before its first step.

  kind: 'workdir' (own checkpoint: full state, data iterator, RNG),
    'resume' (another run's checkpoint: full state), 'init_from'
    (a weights file/dir for the models module: parameters only), or
    'scratch'.
  path: checkpoints directory ('workdir', 'resume') or weights path.
  step: checkpoint step ('workdir', 'resume'), else None.
  """
  kind: str
  path: str | None = None
  step: int | None = None


def find_checkpoint(path, *, prefer_best: bool = False) -> tuple[str, int | None]:
  """Which checkpoint a path names: (checkpoints directory, step or None).

  Args:
    path: a run's workdir, its checkpoints directory or one step's directory.
    prefer_best: for a workdir or checkpoints directory, the recorded best
      step (`best.json`) if it is complete, else the latest complete step.
  """
  p = epath.Path(path)
  if (p / checkpoint.CHECKPOINT_SUBDIR).is_dir():
    p = p / checkpoint.CHECKPOINT_SUBDIR
  if p.name.isdigit() and (p / "state").is_dir():  # one step's directory
    return os.fspath(p.parent), int(p.name)
  best = checkpoint.read_best(p) if prefer_best else None
  return os.fspath(p), (best["step"] if best
                        else checkpoint.latest_complete_step(p))


def resolve_start(workdir, config) -> StartPoint:
  """Decides what to load, in order: workdir, `resume`, `init_from`, scratch.

  Reads `config.resume` and `config.init_from` (paths; empty/None = unset).
  A complete checkpoint in the workdir wins, so a preempted run rerun with
  the same command continues where it stopped, even if `resume` is set.

  Raises:
    errors.PathError: `resume` or `init_from` names a path with nothing to
      load (a FileNotFoundError).
  """
  own = checkpoint.checkpoint_dir(workdir)
  step = checkpoint.latest_complete_step(own)
  if step is not None:
    return StartPoint("workdir", own, step)
  resume = config.resume or None
  if resume:
    directory, step = find_checkpoint(resume)
    if step is None:
      raise errors.PathError(
          f"config.resume={resume!r}: no complete checkpoint found there",
          hint="give a run's workdir, its checkpoints/ dir or a step dir")
    return StartPoint("resume", directory, step)
  init_from = config.init_from or None
  if init_from:
    if not epath.Path(init_from).exists():
      raise errors.PathError(f"config.init_from={init_from!r} does not exist")
    return StartPoint("init_from", os.fspath(init_from))
  return StartPoint("scratch")


# ---------------------------------------------------------------------------
# Before restoring: does the checkpoint fit? Left-overs of a killed save.
# ---------------------------------------------------------------------------
def _shapes(tree) -> dict[str, tuple]:
  return {keypaths.name(p): tuple(x.shape)
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def check_fits(start: StartPoint, target: Any,
               config) -> list[tuple[str, Any, Any]]:
  """Stops before a restore whose arrays would not fit the new run.

  Reads the checkpoint's metadata only (shapes, and the config it was saved
  with), so nothing is loaded, written or left half-done.

  Args:
    start: a 'workdir' or 'resume' start point.
    target: the new run's state: arrays or `jax.ShapeDtypeStruct`s.
    config: the new run's config.

  Returns:
    The config keys that changed since the checkpoint was saved, accepted:
    (dotted key, saved value, new value); [] when it recorded no config.

  Raises:
    errors.WorkdirError: naming the config keys that changed and the first
      arrays whose shapes differ.
  """
  with checkpoint.reader(start.path) as mngr:
    saved = _shapes(mngr.item_metadata(start.step)["state"])
    meta = mngr.restore(start.step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))["meta"]
  saved_config = meta.get("metadata", {}).get("config")
  changed = config_lib.changes(saved_config, config.to_dict()) if saved_config else []
  want = _shapes(target)
  differ = sorted(k for k in saved.keys() | want.keys()
                  if saved.get(k) != want.get(k))
  if not differ:
    return changed
  # The model and optimizer decide the arrays; other keys may change freely.
  shaping = [c for c in changed if c[0].startswith(("model.", "optim."))] or changed
  keys = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in shaping[:6]) or (
      "not recorded in the checkpoint")
  differ.sort(key=lambda k: not k.startswith("params."))
  arrays = "; ".join(f"{k}: saved {saved.get(k, 'nothing')}, now "
                     f"{want.get(k, 'nothing')}" for k in differ[:2])
  raise errors.WorkdirError(
      f"the checkpoint {start.path}/{start.step} was saved by another model: "
      f"changed config: {keys}. {len(differ)} arrays differ, e.g. {arrays}",
      hint="use a new --workdir for the new model, or set those keys back to "
      "resume (the run's config is in its config.json); nothing was changed")


def remove_partial_saves(workdir) -> list[str]:
  """Deletes WORKDIR/checkpoints/*.orbax-checkpoint-tmp* (process 0 only).

  A run killed while saving leaves such a directory; it is never restored,
  only takes disk space. Call at start-up, before any save.

  Returns:
    The directories removed.
  """
  directory = epath.Path(checkpoint.checkpoint_dir(workdir))
  if jax.process_index() != 0 or not directory.is_dir():
    return []
  removed = []
  for path in sorted(directory.iterdir()):
    if checkpoint.TMP_SUFFIX in path.name:
      shutil.rmtree(os.fspath(path), ignore_errors=True)
      removed.append(os.fspath(path))
      logging.info("removed %s, the left-over of a save that did not finish",
                   path)
  return removed
