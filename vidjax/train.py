"""The training loop, top to bottom: one generic loop for every task.

    train_and_evaluate(config, workdir)   # `python -m vidjax.main`
    evaluate_only(config, workdir)        # `python -m vidjax.main --mode eval`

`setup` resolves and builds the run (`vidjax.startup`: everything a user
can get wrong checked, the config locked, the state restored or
initialised, already sharded, and the jitted steps), then writes what the
run accepted. The loop: batches from the pipeline (built at its resume
point), one step, metrics logged one step late, checkpoints, preemption,
evaluations (`vidjax.evaluation.eval_sets`); then the final evaluation and the
closing report.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections

from vidjax import startup, steps as steps_lib
from vidjax.base import errors, rundir, stopping
from vidjax.checkpoints import checkpoint, checkpoint_reader, resume
from vidjax.data import batches, checks
from vidjax.evaluation import eval_sets
from vidjax.models import flops as flops_lib, shapes
from vidjax.report import console, monitor

# Steps after the start before the time estimate.
ESTIMATE_AFTER_STEPS = 10
# The data-bound warning: more than this share of the wall time spent
# waiting for batches over the last DATA_BOUND_WINDOW steps; said again
# while it lasts, at most every DATA_BOUND_REPEAT_S seconds.
DATA_BOUND_FRACTION = 0.5
DATA_BOUND_WINDOW = 20
DATA_BOUND_REPEAT_S = 600.0


def _start_text(start: resume.StartPoint) -> str:
  return {
    "workdir": f"resuming at step {start.step}",
    "resume": f"resuming {start.path} at step {start.step}",
    "init_from": f"parameters from {start.path}",
  }.get(start.kind, "from scratch")


def setup(
  config: ml_collections.ConfigDict,
  workdir: Path,
  *,
  splits: tuple[str, ...] = (),
) -> startup.Run:
  """The run, resolved and built (`vidjax.startup`), then accepted.

  `startup.resolve` and `startup.build` check everything a user can get
  wrong before the workdir is touched; then WORKDIR/config.json and
  WORKDIR/log.txt are written, damaged checkpoints set aside, and the
  config keys changed since the checkpoint listed. (Half-written
  checkpoints go when the training's `Checkpointer` opens.) The run's
  config is `run.config`, locked; `config` is left as given.
  """
  plan = startup.resolve(config, workdir, splits=splits)
  try:
    run = startup.build(plan)
  finally:
    plan.close()
  config, start, reports = run.config, run.start, plan.reports
  try:
    stopping.check()
    # --- The run is accepted: from here on the workdir is written.
    if reports:
      checks.report(reports, config, workdir)
    resume.set_aside_damaged(start)
    if "train" in splits or not splits:  # An evaluation keeps the run's own.
      rundir.write_config(config, workdir)
    if jax.process_index() == 0:
      console.attach_log_file(workdir)
    if start.kind in ("workdir", "resume"):
      logging.info(
        "resumed from %s at step %d%s",
        start.path,
        start.step,
        "".join(f"\n  set {line}" for line in plan.settled),
      )
      _say_changes(run.changed, start.step, warn="train" in splits)
    elif start.kind == "init_from":
      run.init_report.log(workdir)  # Also WORKDIR/init_from.json.
    if splits:
      _log_summary(run, config, reports, start)
  except BaseException:
    if run.train_batches is not None:
      run.train_batches.close()
    raise
  return run


def _say_changes(changed: list, step: int, warn: bool) -> None:
  """Lists the config keys changed since the checkpoint (accepted ones)."""
  if not changed:
    return
  shown = [f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:12]]
  if len(changed) > 12:
    shown.append(f"and {len(changed) - 12} more (compare with config.json)")
  (logging.warning if warn else logging.info)(
    "changed since the checkpoint of step %d:\n  %s", step, "\n  ".join(shown)
  )


def _log_summary(run: startup.Run, config, reports: dict, start) -> None:
  """The start-up summary; a warning when the batch is larger than the data."""
  num_params = sum(x.size for x in jax.tree.leaves(run.state["params"]))
  clips = {s: len(r.kept_records()) for s, r in reports.items()}
  logging.info(
    "%s",
    console.run_summary(
      devices=jax.devices(),
      batch_size=config.batch_size,
      repeats=config.data.get("repeats", 1),
      accum_steps=config.accum_steps,
      num_params=num_params,
      clips=clips,
      total_steps=config.total_steps,
      first_step=int(run.state["step"]),
      start=_start_text(start),
    ),
  )
  if (
    "train" in clips
    and config.model.name == "clip"
    and config.model.mask_ratio > 0
  ):
    logging.info("%s", _masking_summary(config, run.steps.unmask_start))
  # The :debug recipes' synthetic corpus is small on purpose (a check of the
  # whole path): its repeated clips are no mistake of the user's.
  synthetic_data = (
    config.data.synthetic.enabled
    and run.workdir is not None
    and Path(config.data.root).is_relative_to(
      rundir.path(run.workdir, rundir.SYNTHETIC)
    )
  )
  repeats = config.data.get("repeats", 1)
  decoded = config.batch_size // repeats
  if "train" in clips and decoded > clips["train"] and not synthetic_data:
    # With repeats, a batch decodes batch_size / repeats clips.
    per_batch = f" / data.repeats={repeats}" if repeats > 1 else ""
    logging.warning(
      "batch_size=%d%s is larger than the %d training clips: every "
      "batch repeats clips; lower --config.batch_size",
      config.batch_size,
      per_batch,
      clips["train"],
    )


def _tuning_text(config) -> str:
  """How the unmasked tuning differs from the masked steps, or ''."""
  parts = []
  accum = steps_lib.unmask_accum(config)
  if accum != config.accum_steps:
    parts.append(f"in {accum} microbatches (the same global batch)")
  tuning = steps_lib.unmask_tuning(config)
  if tuning is not None:
    parts.append(
      f"at its own learning rate {tuning.lr:g} after "
      f"{tuning.warmup_steps} warmup steps"
    )
  return "".join(f", {p}" for p in parts)


def _masking_summary(config, unmask_at: int | None) -> str:
  """What masked training drops, and when the unmasked tuning starts."""
  model = config.model
  tokens = (
    shapes.attention_shapes(model)["vision"].tokens,
    shapes.attention_shapes(shapes.unmasked(model))["vision"].tokens,
  )
  flops = [
    flops_lib.flops_per_example(m)["training"]
    for m in (model, shapes.unmasked(model))
  ]
  tuning = (
    "no unmasked tuning (unmask_fraction=0)"
    if unmask_at is None
    else f"unmasked tuning from step {unmask_at + 1} to {config.total_steps}"
  )
  return (
    f"masked training: the video tower sees {tokens[0]} of its "
    f"{tokens[1]} tokens ({model.mask_kind}, mask_ratio "
    f"{model.mask_ratio:g}): {flops[0] / flops[1]:.2f}x the FLOPs per "
    f"clip; {tuning}; evaluation sees every token"
  )


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates without training (`python -m vidjax.main --mode eval`).

  The parameters: the workdir's latest checkpoint, else `config.resume`,
  else `config.init_from` (released or vidjax weights: zero-shot). Every
  evaluation set runs once; the metrics are appended to
  WORKDIR/metrics.jsonl at the checkpoint's step and printed as a table.
  SIGTERM/Ctrl-C during start-up stop it before anything is written
  (`errors.Stopped`); during the evaluation, it finishes first.

  Returns:
    The `eval/...` metrics.

  Raises:
    errors.WorkdirError: there is nothing to evaluate, or the workdir
      cannot be written or is in use.
  """
  with (
    stopping.handling(
      "before the evaluation; nothing was written: run "
      "the same command to evaluate"
    ) as preemption,
    rundir.claim(workdir) as workdir,
  ):
    start = resume.resolve_start(workdir, config, verify=False)
    start.close()
    if start.kind == "scratch":
      raise errors.WorkdirError(
        f"{workdir} has no checkpoint to evaluate",
        hint="check the --workdir path, or evaluate other weights with "
        "--config.init_from=PATH (or --config.resume=RUN_DIR)",
      )
    run = setup(config, workdir, splits=("eval",))
    config = run.config
    preemption.check()  # A signal during setup's last part stops here.
    preemption.defer("the evaluation finishes and is written first")
    try:
      metrics = eval_sets.evaluate(run, config)
    except stopping.EvaluationStopped as e:  # Its data stopped coming.
      raise errors.Stopped(
        f"{e}; nothing was written: run the same command to evaluate"
      ) from None
    with monitor.MetricWriter(workdir) as writer:
      writer.write(int(run.state["step"]), metrics)
    logging.info("%s", console.eval_table(int(run.state["step"]), metrics))
  return metrics


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming if the workdir has a checkpoint) and evaluates.

  One run at a time in a workdir (`rundir.claim`). SIGTERM/Ctrl-C stop the
  run without losing anything (`vidjax.base.stopping`): during start-up before
  anything more is written (`errors.Stopped`); in training after saving a
  checkpoint of the current step (`errors.Preempted`).

  Returns:
    The last evaluation's metrics.
  """
  workdir = rundir.absolute(workdir)
  directory = rundir.checkpoints(workdir)
  with stopping.handling(
    "before the first step", abort_note=lambda: _newest_checkpoint(directory)
  ) as preemption:
    try:
      with rundir.claim(workdir):
        return _train(config, workdir, preemption)
    except errors.Preempted:
      raise
    except errors.Stopped as e:  # In start-up: say what the rerun does.
      step = checkpoint_reader.latest_complete_step(directory)
      raise errors.Stopped(
        f"{e}; "
        + (
          "no checkpoint was saved: run the same command to start again"
          if step is None
          else f"the last complete checkpoint is step {step}"
          f" (in {directory}): run the same command to resume from it"
        )
      ) from None


def _newest_checkpoint(directory: str) -> str:
  """What Ctrl-C pressed twice leaves: the newest step directory (a save
  under way is abandoned; Orbax names it `<step>.orbax-checkpoint-tmp*`)."""
  steps = (
    [int(n) for n in os.listdir(directory) if n.isdigit()]
    if os.path.isdir(directory)
    else []
  )
  if not steps:
    return "no checkpoint was saved: run the same command to start again"
  return (
    f"the newest checkpoint is step {max(steps)} (in {directory}): run "
    "the same command to resume from it"
  )


def _train(
  config: ml_collections.ConfigDict, workdir: Path, preemption: stopping.Signals
) -> dict:
  """`train_and_evaluate` in its claimed workdir, its signals handled."""
  # ------------------------------------------------------------------ setup
  run = setup(config, workdir, splits=("train", "eval"))
  config = run.config
  first_step = step = int(run.state["step"])
  # Each step's randomness folds the step into it: a resumed run continues
  # with its checkpoint's key (the same, unless the seed was changed).
  base_key = jax.random.key(config.seed) if run.rng is None else run.rng
  unmask_at = run.steps.unmask_start  # None: no unmasked tuning.

  def flops_per_step(step: int) -> float:
    """Of the step run from `step`: the tokens it processes (the kept ones
    under masking, every one in the unmasked tuning), and the second
    forward pass of accumulation by embedding cache."""
    if config.model.get("probe"):  # Its steps run the probe alone, on the
      # cached features: no model FLOPs to count, no MFU to claim.
      return 0.0
    masked = unmask_at is None or step < unmask_at
    model = config.model if masked else shapes.unmasked(config.model)
    accum = config.accum_steps if masked else steps_lib.unmask_accum(config)
    flops = flops_lib.flops_per_example(model)
    extra = (
      flops["forward"] if steps_lib.caches_embeddings(config, accum) else 0
    )
    return (flops["training"] + extra) * config.batch_size

  timer = monitor.StepTimer(
    global_batch=config.batch_size,
    repeats=config.data.get("repeats", 1),
    flops_per_step=flops_per_step(step),
    peak_flops_per_device=config.peak_tflops * 1e12
    or monitor.peak_flops_per_device(),
    window_steps=DATA_BOUND_WINDOW,
  )
  data_bound = monitor.DataBoundWatch(
    timer, threshold=DATA_BOUND_FRACTION, repeat_s=DATA_BOUND_REPEAT_S
  )
  late = monitor.LateMetrics()
  bar = console.ProgressBar(config.total_steps, first_step)
  eval_every = config.eval.every_steps
  # The last checkpoint of this run's own (another run's is not named).
  last_eval = {}
  last_saved = first_step if run.start.kind == "workdir" else None
  preempted, estimated = False, False
  # With several processes, the others may already wait in the step for this
  # one's batch: a wait for data is not cut short.
  single_process = jax.process_count() == 1

  def log(item):
    nonlocal estimated
    if item is None:
      return
    logged_step, metrics = item
    monitor.check_finite(
      metrics, step=logged_step, last_checkpoint_step=last_saved
    )
    metrics["data/skipped"] = train_batches.skipped
    if (
      logged_step % config.log.every_steps == 0
      or logged_step == config.total_steps
    ):
      metrics.update(timer.summary())
      writer.write(logged_step, metrics)
      if (
        not estimated
        and logged_step >= first_step + ESTIMATE_AFTER_STEPS
        and "perf/step_time_s" in metrics
      ):
        estimated = True  # Once, past the compilation and the first batches.
        logging.info(
          "%s",
          console.time_estimate(
            logged_step, config.total_steps, metrics["perf/step_time_s"]
          ),
        )
    waiting = data_bound.check()  # Watched during the whole run.
    if waiting is not None:
      logging.warning("%s", console.data_bound_warning(waiting, config.data))
    bar.update(
      logged_step,
      {
        k: v
        for k, v in metrics.items()
        if k in ("train/loss", "perf/clips_per_s")
        or (k == "data/skipped" and v)
      },
    )

  def save_last_step() -> None:
    """The loop stops while it waits for data: the last completed step is
    checked, logged, saved with the position after its batch, and written."""
    log(late.flush())
    ckpt.save(
      step,
      run.state,
      data_state=train_batches.get_state(),
      rng=base_key,
      force=True,
    )
    ckpt.wait_until_finished()

  def evaluate_and_log() -> dict:
    metrics = eval_sets.evaluate(run, config)
    writer.write(step, metrics)
    logging.info("%s", console.eval_table(step, metrics))
    return metrics

  # Closed on the way out, on an error too: the pipeline's workers stop, and
  # a save in flight finishes (Orbax moves a save into place once whole).
  with (
    contextlib.closing(run.train_batches) as train_batches,
    monitor.MetricWriter(workdir) as writer,
    checkpoint.Checkpointer.from_config(
      workdir, config, metadata={"config": config.to_dict()}
    ) as ckpt,
  ):
    preemption.check()  # The last stop point of the start-up.
    preemption.defer("will save a checkpoint and stop")
    # --------------------------------------------------------------- loop
    with bar, stopping.on_abort(bar.close):  # The error is the last line.
      while step < config.total_steps:
        with timer.waiting_for_data():
          try:  # None: SIGTERM or Ctrl-C while it waited (one process).
            batch = train_batches.next_batch(
              interrupt=lambda: preemption.requested and single_process
            )
          except errors.DataWorkerDied:
            save_last_step()
            raise
        if batch is None:
          save_last_step()
          preempted = True
          break
        if step == unmask_at:  # Its step compiles now, once.
          logging.info(
            "the unmasked tuning starts: steps %d to %d train on "
            "every video token%s",
            step + 1,
            config.total_steps,
            _tuning_text(config),
          )
          timer.flops_per_step = flops_per_step(step)
        run.state, metrics = run.steps.train_at(step)(
          run.state, run.rest, batch, base_key
        )
        step += 1
        timer.step()
        if step - 1 in (first_step, unmask_at):
          jax.block_until_ready(run.state)
          timer.reset()  # The step compiled; don't count it.
        log(late.push(step, metrics))
        stop = preemption.should_stop(step)
        final = step == config.total_steps
        evaluating = eval_every and step % eval_every == 0 and not final
        if stop or final or evaluating or ckpt.should_save(step):
          # No checkpoint may hold non-finite weights: this step's metrics
          # (its loss and gradient norm) first, one wait for the device per
          # save; `log` sees them only a step later.
          monitor.check_finite(
            monitor.to_python(metrics),
            step=step,
            last_checkpoint_step=last_saved,
          )
        if ckpt.save(
          step,
          run.state,
          data_state=train_batches.get_state(),
          rng=base_key,
          force=stop or final,
        ):
          last_saved = step
        if stop:
          preempted = True
          break
        if evaluating:
          try:
            last_eval = evaluate_and_log()
          except stopping.EvaluationStopped as e:  # Stuck data after a signal.
            logging.warning(
              "%s; saving the checkpoint of step %d (--mode eval evaluates it)",
              e,
              step,
            )
            save_last_step()
            preempted = True
            break
          ckpt.record_eval(
            step,
            last_eval,
            run.state,
            rng=base_key,
            data_state=train_batches.get_state(),
          )
      preemption.defer(
        f"the final evaluation and the checkpoint of step "
        f"{step} finish first, then the run ends"
      )
      log(late.flush())
    train_batches.close()  # Its workers stop before the final evaluation.
    _say_read_failures(train_batches.failures)
    if step >= config.total_steps:
      try:
        last_eval = evaluate_and_log()
        ckpt.record_eval(step, last_eval, run.state)  # The final step is saved.
      except stopping.EvaluationStopped as e:  # The rerun evaluates it.
        logging.warning("%s", e)
        preempted = True
    ckpt.wait_until_finished()
    saved_steps = ckpt.all_steps()
  if jax.process_index() == 0:
    plots = _draw_plots(workdir) if config.log.plots else []
    logging.info(
      "%s",
      console.end_message(
        workdir,
        step,
        config.total_steps,
        plots,
        saved_steps,
        stopped=preempted,
      ),
    )
  if preempted:
    if jax.process_count() > 1:  # Nobody exits (75) before every save is done.
      multihost_utils.sync_global_devices("vidjax:preempted")
    raise errors.Preempted(step, os.fspath(rundir.checkpoints(workdir)))
  return last_eval


def _say_read_failures(failures) -> None:
  """The end-of-training summary of clips that could not be read, per file."""
  if failures:
    logging.warning(
      "%d clip reads failed in %d file%s during training (other clips were "
      "read instead):\n  %s",
      sum(failures.values()),
      len(failures),
      "s" if len(failures) > 1 else "",
      "\n  ".join(batches.failure_lines(failures)),
    )


def _draw_plots(workdir: Path) -> list[Path]:
  """WORKDIR/plots/*.png, or none (said) without matplotlib or a place to
  write them: the run is whole without them."""
  try:
    # Imported here: matplotlib (the `[plots]` extra) draws the plots only.
    from vidjax.report import plot

    plots = plot.plot_run(workdir)  # WORKDIR/plots/*.png
  except ModuleNotFoundError as e:  # A run is whole without the plots.
    if not (e.name or "").startswith("matplotlib"):
      raise
    plots = []
    logging.warning(
      "no plots: matplotlib is not installed. pip install "
      "'vidjax[plots]', then `python -m vidjax.plot %s` draws them",
      workdir,
    )
  except OSError as e:  # The run is whole without them: said, not fatal.
    plots = []
    logging.warning(
      "the plots could not be written (%s): `python -m vidjax.plot %s` "
      "draws them later",
      e.strerror or e,
      workdir,
    )
  return plots
