"""Where a run starts, what it starts from, and restoring its checkpoint.

Where a run starts (`resolve_start`): its own latest checkpoint; else
`config.resume` (another run's checkpoints: full state); else
`config.init_from` (parameters only, filled by `vidjax.weights.init_from`);
else scratch. A checkpoint's directory is opened once for it
(`checkpoint_reader.RunCheckpoints`, kept on the `StartPoint`) and read
from there on. `read_start` reads what that start brings before the model
is built: every tensor of `init_from` (`read_init_from`: a vidjax run's
checkpoint, or what `vidjax.weights.sources` reads), or the config a
checkpoint to resume was saved with (what the run computed with).

A checkpoint's files are verified against the checksums saved with it
(`vidjax.checkpoints.checksums`): its metadata when the start is resolved, its arrays
while `restore` reads them. A damaged step is named with what is wrong and
the newest intact one is taken instead (`set_aside_damaged` then moves the
run's own damaged steps out of the way). Before a checkpoint is restored,
`check_fits` compares its array shapes with the new run's (from the files'
metadata, reading no array) and names the config keys that changed.
How SIGTERM and Ctrl-C stop a run so that it resumes: `vidjax.base.stopping`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging
from etils import epath
import jax

from vidjax import config as config_lib
from vidjax.base import errors, rundir
from vidjax.checkpoints import checkpoint_reader
from vidjax.weights import facts, init_from, sources


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
  damaged: the workdir's damaged steps newer than `step` ('workdir').
  named: `resume` named this one step: no other is taken for it.
  checkpoints: the directory opened for reading ('workdir', 'resume'),
    until `close`.
  """

  kind: str
  path: str | None = None
  step: int | None = None
  damaged: tuple[int, ...] = ()
  named: bool = dataclasses.field(default=False, compare=False)
  checkpoints: checkpoint_reader.RunCheckpoints | None = dataclasses.field(
    default=None, compare=False, repr=False
  )

  def close(self) -> None:
    if self.checkpoints is not None:
      self.checkpoints.close()


def _none_intact(directory, damaged: list[int]) -> errors.WorkdirError:
  return errors.WorkdirError(
    f"no intact checkpoint in {directory}: steps "
    f"{', '.join(map(str, damaged))} are damaged (see above)",
    hint=f"copy intact ones back from a backup, or move {directory} away "
    "to start from scratch (python -m vidjax.checksums STEP_DIR checks one)",
  )


def _newest_intact(
  ckpts: checkpoint_reader.RunCheckpoints,
  steps: list[int],
  part: str | None = None,
) -> tuple[int, list[int]]:
  """The first of `steps` whose files (`part` of them, see
  `checksums.verify`) are intact, and the damaged ones before.

  Each damaged step is logged with what is wrong.

  Raises:
    errors.WorkdirError: none is intact (nothing to do but say so).
  """
  damaged = []
  for step in steps:
    problem = ckpts.verify(step, part)
    if problem is None:
      if damaged:
        logging.warning(
          "using step %d instead, the newest intact checkpoint", step
        )
      return step, damaged
    logging.warning(
      "the checkpoint %s/%d is damaged: %s", ckpts.directory, step, problem
    )
    damaged.append(step)
  raise _none_intact(ckpts.directory, damaged)


def _open(
  path, *, prefer_best: bool = False, part: str | None = None
) -> tuple[checkpoint_reader.RunCheckpoints, int | None, bool]:
  """`find_checkpoint`, its directory left open: (checkpoints, step or
  None, whether `path` named the step)."""
  p = epath.Path(path)
  if (p / rundir.CHECKPOINTS).is_dir():  # (epath: URLs too.)
    p = p / rundir.CHECKPOINTS
  if p.name.isdigit() and (p / "state").is_dir():  # one step's directory
    ckpts = checkpoint_reader.RunCheckpoints(p.parent)
    problem = ckpts.verify(int(p.name), part)
    if problem:
      ckpts.close()
      raise _named_damaged(p, problem)
    return ckpts, int(p.name), True
  ckpts = checkpoint_reader.RunCheckpoints(p)
  steps = ckpts.steps()
  best = ckpts.best() if prefer_best else None
  if best:  # The best first, then the newest.
    steps = [best["step"]] + [s for s in steps if s != best["step"]]
  try:
    return (
      ckpts,
      _newest_intact(ckpts, steps, part)[0] if steps else None,
      False,
    )
  except BaseException:
    ckpts.close()
    raise


def _named_damaged(step_dir, problem: str) -> errors.WorkdirError:
  return errors.WorkdirError(
    f"the checkpoint {step_dir} is damaged: {problem}",
    hint="name another step, or the run's workdir "
    "for its newest intact checkpoint",
  )


def find_checkpoint(
  path, *, prefer_best: bool = False
) -> tuple[str, int | None]:
  """Which checkpoint a path names: (checkpoints directory, step or None).

  A step whose files are damaged is skipped, saying so, for the next newest.

  Args:
    path: a run's workdir, its checkpoints directory or one step's directory.
    prefer_best: for a workdir or checkpoints directory, the recorded best
      step (`best.json`) if it is complete, else the latest complete step.

  Raises:
    errors.WorkdirError: the step named, or every step there, is damaged.
  """
  ckpts, step, _ = _open(path, prefer_best=prefer_best)
  ckpts.close()
  return os.fspath(ckpts.directory), step


def resolve_start(workdir, config, *, verify: bool = True) -> StartPoint:
  """Decides what to load, in order: workdir, `resume`, `init_from`, scratch.

  Reads `config.resume` and `config.init_from` (paths; empty/None = unset).
  A complete checkpoint in the workdir wins, so a preempted run rerun with
  the same command continues where it stopped, even if `resume` is set.
  Its newest step whose metadata is intact is taken; its arrays are
  verified as `restore` reads them. The checkpoints directory stays open
  on the start point (`StartPoint.close`).

  Args:
    workdir: the run's directory.
    config: the run's config.
    verify: check the checkpoint's metadata files; False only says where
      the run would start.

  Raises:
    errors.PathError: `resume` or `init_from` names a path with nothing to
      load (a FileNotFoundError).
    errors.WorkdirError: every checkpoint there is damaged.
  """
  own = checkpoint_reader.RunCheckpoints(rundir.checkpoints(workdir))
  steps = own.steps()
  if steps:
    try:
      step, damaged = (
        _newest_intact(own, steps, "metadata")
        if verify
        else (
          steps[0],
          [],
        )
      )
    except BaseException:
      own.close()
      raise
    return StartPoint(
      "workdir", os.fspath(own.directory), step, tuple(damaged), checkpoints=own
    )
  own.close()
  resume = config.resume or None
  if resume:
    ckpts, step, named = _open(resume, part="metadata")
    if step is None:
      ckpts.close()
      raise errors.PathError(
        f"config.resume={resume!r}: no complete checkpoint found there",
        hint="give a run's workdir, its checkpoints/ dir or a step dir",
      )
    return StartPoint(
      "resume", os.fspath(ckpts.directory), step, named=named, checkpoints=ckpts
    )
  init_from = config.init_from or None
  if init_from:
    if not epath.Path(init_from).exists():
      raise errors.PathError(f"config.init_from={init_from!r} does not exist")
    return StartPoint("init_from", os.fspath(init_from))
  return StartPoint("scratch")


def read_init_from(
  path: str, *, allow_pickle: bool = False
) -> init_from.Source:
  """What `config.init_from` names, as a `Source`.

  Args:
    path: a vidjax run: its workdir or checkpoints directory (the best
      checkpoint if recorded, else the newest intact one) or one step
      directory, read as its parameters and the config saved with them;
      else what `sources.read_source` reads (a weights file, a Hugging
      Face directory).
    allow_pickle: see `tensor_io.load_state_dict`.
  """
  if os.path.isdir(path) and not sources.is_hugging_face(path):
    directory, step = find_checkpoint(path, prefer_best=True)
    if step is not None:
      params, config = checkpoint_reader.read_params(directory, step)
      return sources.vidjax_source(
        params, config, os.path.join(directory, str(step))
      )
  return sources.read_source(path, allow_pickle=allow_pickle)


def read_start(
  start: StartPoint, *, allow_pickle: bool = False
) -> init_from.Source | None:
  """The source of a run's weights, read before its model is built.

  'init_from': `read_init_from` (every tensor). 'workdir' and 'resume': the
  checkpoint's saved config only, for its facts (what the run trained
  with); its state is restored later. 'scratch': None.
  """
  if start.kind == "init_from":
    return read_init_from(start.path, allow_pickle=allow_pickle)
  if start.kind not in ("workdir", "resume"):
    return None
  config = start.checkpoints.config(start.step)
  kind = (config.get("model") or {}).get("name") or "run"
  return init_from.Source(
    kind,
    {},
    {},
    f"{start.path}/{start.step} (vidjax {kind})",
    facts=facts.run_facts(config),
  )


# ---------------------------------------------------------------------------
# Before restoring: does the checkpoint fit? Damaged steps set aside.
# ---------------------------------------------------------------------------
def check_fits(
  start: StartPoint, target: Any, config, *, training: bool = True
) -> list[tuple[str, Any, Any]]:
  """Stops before a restore whose arrays would not fit the new run.

  Reads the checkpoint's metadata only (shapes, and the config it was saved
  with), so nothing is loaded, written or left half-done. Training goes on
  with the checkpoint's batch size only (`check_batch`).

  Args:
    start: a 'workdir' or 'resume' start point.
    target: the new run's state: arrays or `jax.ShapeDtypeStruct`s.
    config: the new run's config.
    training: the run trains on from the checkpoint (its batch size must
      be the saved one); False: it only evaluates the checkpoint.

  Returns:
    The config keys that changed since the checkpoint was saved, accepted:
    (dotted key, saved value, new value); [] when it recorded no config.

  Raises:
    errors.WorkdirError: naming the config keys that changed and the first
      arrays whose shapes differ.
  """
  saved = start.checkpoints.shapes(start.step)
  saved_config = start.checkpoints.config(start.step)
  changed = (
    config_lib.changes(saved_config, config.to_dict()) if saved_config else []
  )
  if training:
    check_batch(start, changed)
  want = checkpoint_reader.tree_shapes(target)
  differ = sorted(
    k for k in saved.keys() | want.keys() if saved.get(k) != want.get(k)
  )
  if not differ:
    return changed
  # The model and optimizer decide the arrays; other keys may change freely.
  shaping = [
    c for c in changed if c[0].startswith(("model.", "optim."))
  ] or changed
  keys = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in shaping[:6]) or (
    "not recorded in the checkpoint"
  )
  differ.sort(key=lambda k: not k.startswith("params."))
  arrays = "; ".join(
    f"{k}: saved {saved.get(k, 'nothing')}, now {want.get(k, 'nothing')}"
    for k in differ[:2]
  )
  raise errors.WorkdirError(
    f"the checkpoint {start.path}/{start.step} was saved by another model: "
    f"changed config: {keys}. {len(differ)} arrays differ, e.g. {arrays}",
    hint="use a new --workdir for the new model, or set those keys back to "
    "resume (the run's config is in its config.json); nothing was changed",
  )


def restore(
  start: StartPoint, target: Any, config, *, training: bool = True
) -> tuple[StartPoint, checkpoint_reader.Restored, list[tuple[str, Any, Any]]]:
  """Restores the start's checkpoint onto `target`, checked and verified.

  `check_fits` first (metadata only), then the restore, which verifies the
  arrays' files as it reads them. A damaged step is named and the next
  newest intact one is taken, as `resolve_start` does (not where `resume`
  named the step: that is refused).

  Args:
    start: a 'workdir' or 'resume' start point, its directory open.
    target: the new run's abstract state (`jax.ShapeDtypeStruct`s with
      shardings).
    config: the new run's config.
    training: see `check_fits`.

  Returns:
    (the start point restored: its step and damaged steps as found, the
    `Restored`, the config keys changed since that step was saved).

  Raises:
    errors.WorkdirError: the checkpoint does not fit (`check_fits`), or
      no step there is intact.
  """
  ckpts, damaged = start.checkpoints, list(start.damaged)
  newest = start.step
  steps = [newest] if start.named else [s for s in ckpts.steps() if s <= newest]
  for step in steps:
    if step != newest:
      problem = ckpts.verify(step, "metadata")
      if problem is None and facts.run_facts(ckpts.config(step)) != (
        facts.run_facts(ckpts.config(newest))
      ):
        raise errors.WorkdirError(
          f"the checkpoint {ckpts.directory}/{newest} is damaged (see above) "
          f"and step {step} was trained with other model settings",
          hint=f"move {ckpts.directory}/{newest} away and run the same "
          "command to resume from the newest intact step",
        )
      if problem is not None:
        logging.warning(
          "the checkpoint %s/%d is damaged: %s", ckpts.directory, step, problem
        )
        damaged.append(step)
        continue
    at = dataclasses.replace(
      start,
      step=step,
      damaged=tuple(damaged) if start.kind == "workdir" else (),
    )
    try:
      try:
        changed = check_fits(at, target, config, training=training)
      except errors.UserError:
        raise
      except Exception as e:
        # Orbax's index of the arrays (read for their shapes) lives in the
        # arrays' files: damaged ones may fail it before the restore.
        problem = ckpts.verify(step, "arrays")
        if problem is None:
          raise
        raise checkpoint_reader.Damaged(step, problem) from e
      restored = ckpts.restore(step, target)
    except checkpoint_reader.Damaged as e:
      if start.named:
        raise _named_damaged(ckpts.step_dir(step), e.problem) from None
      logging.warning(
        "the checkpoint %s/%d is damaged: %s", ckpts.directory, step, e.problem
      )
      damaged.append(step)
      continue
    if step != newest:
      logging.warning(
        "using step %d instead, the newest intact checkpoint", step
      )
    return at, restored, changed
  raise _none_intact(ckpts.directory, damaged)


def check_batch(start: StartPoint, changed: list[tuple[str, Any, Any]]) -> None:
  """Refuses to train on from a checkpoint with another global batch size.

  The saved data position counts clips of batches of the saved size, the
  saved step counts those batches (the schedule, `total_steps`, the
  evaluations and checkpoints are in them), and the optimizer state was
  built on them: another size would go on from a position and a schedule
  that mean something else (and, where the position is not a whole
  number of the new transfers, could not start at all).

  Args:
    start: the checkpoint's start point.
    changed: `config_lib.changes` since the checkpoint (see `check_fits`).

  Raises:
    errors.WorkdirError: `batch_size` changed, naming the saved one.
  """
  for key, saved, now in changed:
    if key == config_lib.BATCH_KEY and saved is not None:
      raise errors.WorkdirError(
        f"the checkpoint {start.path}/{start.step} was trained with "
        f"batch_size={saved!r}, this run has batch_size={now!r}: a run "
        "resumes with its own batch size (its data position, step count "
        "and schedule are counted in those batches)",
        hint=f"resume with --config.batch_size={saved}, or start a new "
        f"--workdir from these weights with --config.init_from="
        f"{start.path}/{start.step}; nothing was changed",
      )


def set_aside_damaged(start: StartPoint) -> list[str]:
  """Moves the run's damaged steps (`start.damaged`) to `<step>.damaged`.

  Process 0 only, once the run is accepted: the run saves those steps again.

  Returns:
    Where they went.
  """
  moved = []
  if jax.process_index() != 0:
    return moved
  for step in start.damaged:
    source = os.path.join(start.path, str(step))
    target = f"{source}.damaged"
    for n in range(2, 1000):  # Damaged before: keep both.
      if not os.path.exists(target):
        break
      target = f"{source}.damaged{n}"
    os.replace(source, target)
    moved.append(target)
    logging.warning(
      "moved the damaged checkpoint to %s (delete it when you "
      "no longer need it)",
      target,
    )
  return moved
