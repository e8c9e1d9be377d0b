"""The training loop, top to bottom: one generic loop for every task.

    train_and_evaluate(config, workdir)   # `python -m vidjax.main`
    evaluate_only(config, workdir)        # `python -m vidjax.main --mode eval`

`setup` checks everything a user can get wrong, then builds the run: the
model and optimizer state created already sharded and the jitted steps
(`vidjax.steps`), restored or initialised from where it starts
(`vidjax.resume`). The loop: batches from the pipeline (built at its resume
point), one step, metrics logged one step late, checkpoints, preemption,
evaluations (`vidjax.eval_sets`); then the final evaluation and the
closing report.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from absl import logging
import jax
import ml_collections
from jax.experimental import multihost_utils

from vidjax import checkpoint, config as config_lib, console, errors
from vidjax import eval_sets, monitor, resume, sharding, steps as steps_lib
from vidjax import tasks
from vidjax.data import batches, checks, pipeline, synthetic
from vidjax.models import flops as flops_lib, init_from, weights

# Steps after the start before the time estimate and the data-bound check.
ESTIMATE_AFTER_STEPS = 10
DATA_BOUND_FRACTION = 0.5  # Of the wall time spent waiting for batches.


@dataclasses.dataclass
class Run:
  """What a run is built from: devices, task, jitted steps, and its state.

  `state` is the train state {step, params, opt}: its one copy, which the
  loop replaces at each step and evaluations read.
  """
  mesh: jax.sharding.Mesh
  task: object
  tokenizer: object
  state: dict
  rest: object
  steps: steps_lib.Steps
  data_state: object = None  # Where the training batches resume.
  rng: object = None  # The checkpoint's base key; None: from `seed`.
  workdir: Path | None = None  # Where evaluations save embeddings.
  train_records: list | None = None  # Checked rows; None: from the file.
  start: resume.StartPoint = resume.StartPoint("scratch")


def _start_text(start: resume.StartPoint) -> str:
  return {"workdir": f"resuming at step {start.step}",
          "resume": f"resuming {start.path} at step {start.step}",
          "init_from": f"parameters from {start.path}"}.get(start.kind,
                                                            "from scratch")


def setup(config: ml_collections.ConfigDict, workdir: Path, *,
          splits: tuple[str, ...] = ()) -> Run:
  """Config, data, model and optimizer state (sharded), resume point.

  Everything a user can get wrong is checked before the workdir is touched:
  the config, the data paths, the vocabulary, the annotation files of
  `splits` ('train', 'eval'; none for tools on synthetic batches), whether a
  checkpoint to resume fits the model, and the checkpoint or `init_from`
  weights the run starts from are read. (Only a synthetic corpus, which
  these checks read, is written before: WORKDIR/synthetic.) Then
  WORKDIR/config.json and WORKDIR/log.txt are written and half-written
  checkpoints removed.
  """
  config_lib.validate(config, jax.device_count())
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  task = tasks.get_task(config.task)
  synthetic.prepare(config, workdir)
  if splits:
    _check_files(config, splits)
  tokenizer = checks.load_tokenizer(config) if task.NEEDS_TEXT else None
  reports = checks.check_annotations(
      config, splits, needs_text=task.NEEDS_TEXT,
      needs_label=config.task == "classification") if splits else {}
  if "train" in reports:  # `*_epochs` keys count epochs of these records.
    config_lib.epochs_to_steps(config, len(reports["train"].kept_records()))

  start = resume.resolve_start(workdir, config)
  if start.kind in ("workdir", "resume"):
    resume.check_fits(start, steps_lib.build_state_and_steps(
        config, task, mesh, abstract=True)[0], config)
  state, rest, steps = steps_lib.build_state_and_steps(config, task, mesh)
  run = Run(mesh, task, tokenizer, state, rest, steps, workdir=workdir,
            start=start)
  if start.kind in ("workdir", "resume"):
    restored = checkpoint.restore_checkpoint(start.path, state, step=start.step)
    run.state, run.data_state = restored.state, restored.data_state
    run.rng = restored.rng
  elif start.kind == "init_from":  # Parameters only, onto their shardings.
    source = weights.read_source(
        start.path, allow_pickle=config.init_allow_pickle)
    params, init_report = init_from.load_params(
        state["params"], config.model, source,
        keep_init=tuple(config.init_keep))
    run.state = dict(state, params=params)

  # --- The run is accepted: from here on the workdir is written.
  if reports:
    checks.report(reports, config, workdir)
  resume.remove_partial_saves(workdir)
  resume.set_aside_damaged(start)
  if "train" in splits or not splits:  # An evaluation keeps the run's own.
    config_lib.save_config_json(config, workdir)
  if jax.process_index() == 0:
    console.attach_log_file(workdir)
  if start.kind in ("workdir", "resume"):
    logging.info("resumed from %s at step %d", start.path, start.step)
  elif start.kind == "init_from":
    init_report.log(workdir)  # Also WORKDIR/init_from.json.
  if "train" in reports:
    run.train_records = reports["train"].kept_records()
  if splits:
    _log_summary(run, config, reports, start)
  return run


def _check_files(config, splits: tuple[str, ...]) -> None:
  """The files that `splits` read exist (and the evaluation files fit)."""
  actions = config.data.format == "ek100_cls" and config.data.label == "action"
  if actions and not config.data.train_annotations:
    raise errors.ConfigError(
        "data.train_annotations is unset: with data.format='ek100_cls' and "
        "data.label='action', the action ids are numbered over the training "
        "and validation CSVs together (as the head was trained), also to "
        "evaluate", hint="set --config.data.train_annotations to "
        "EPIC_100_train.csv")
  keys = [k for k in eval_sets.required_paths(config, needs_text=False)
          if "train" in splits or not k.startswith("data.train_")
          or (actions and k == "data.train_annotations")]
  checks.check_paths(config, keys)
  if "eval" in splits:
    eval_sets.check_files(config)


def _log_summary(run: Run, config, reports: dict, start) -> None:
  """The start-up summary; a warning when the batch is larger than the data."""
  num_params = sum(x.size for x in jax.tree.leaves(run.state["params"]))
  clips = {s: len(r.kept_records()) for s, r in reports.items()}
  logging.info("%s", console.run_summary(
      devices=jax.devices(), batch_size=config.batch_size,
      accum_steps=config.accum_steps, num_params=num_params,
      clips=clips, total_steps=config.total_steps,
      first_step=int(run.state["step"]), start=_start_text(start)))
  if "train" in clips and config.batch_size > clips["train"]:
    logging.warning("batch_size=%d is larger than the %d training clips: every "
                    "batch repeats clips; lower --config.batch_size",
                    config.batch_size, clips["train"])


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates without training (`python -m vidjax.main --mode eval`).

  The parameters: the workdir's latest checkpoint, else `config.resume`,
  else `config.init_from` (released or vidjax weights: zero-shot). Every
  evaluation set runs once; the metrics are appended to
  WORKDIR/metrics.jsonl at the checkpoint's step and printed as a table.

  Returns:
    The `eval/...` metrics.

  Raises:
    errors.WorkdirError: there is nothing to evaluate.
  """
  workdir = Path(workdir)
  if resume.resolve_start(workdir, config, verify=False).kind == "scratch":
    raise errors.WorkdirError(
        f"{workdir} has no checkpoint to evaluate",
        hint="check the --workdir path, or evaluate other weights with "
        "--config.init_from=PATH (or --config.resume=RUN_DIR)")
  run = setup(config, workdir, splits=("eval",))
  metrics = eval_sets.evaluate(run, config)
  with monitor.MetricWriter(workdir) as writer:
    writer.write(int(run.state["step"]), metrics)
  logging.info("%s", console.eval_table(int(run.state["step"]), metrics))
  return metrics


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming if the workdir has a checkpoint) and evaluates.

  Returns:
    The last evaluation's metrics.
  """
  # ------------------------------------------------------------------ setup
  workdir = Path(workdir)
  run = setup(config, workdir, splits=("train", "eval"))
  first_step = step = int(run.state["step"])
  # Each step's randomness folds the step into it: a resumed run continues
  # with its checkpoint's key (the same, unless the seed was changed).
  base_key = jax.random.key(config.seed) if run.rng is None else run.rng
  flops = flops_lib.flops_per_example(config.model)["training"]
  timer = monitor.StepTimer(
      global_batch=config.batch_size, flops_per_step=flops * config.batch_size,
      peak_flops_per_device=config.peak_tflops * 1e12 or
      monitor.peak_flops_per_device())
  late = monitor.LateMetrics()
  bar = console.ProgressBar(config.total_steps, first_step)
  eval_every = config.eval.every_steps
  # The last checkpoint of this run's own (another run's is not named).
  last_eval = {}
  last_saved = first_step if run.start.kind == "workdir" else None
  preempted, estimated = False, False

  def log(item):
    nonlocal estimated
    if item is None:
      return
    logged_step, metrics = item
    monitor.check_finite(metrics, step=logged_step,
                         last_checkpoint_step=last_saved)
    metrics["data/skipped"] = train_batches.skipped
    if logged_step % config.log.every_steps == 0 or logged_step == config.total_steps:
      metrics.update(timer.summary())
      writer.write(logged_step, metrics)
      if not estimated and logged_step >= first_step + ESTIMATE_AFTER_STEPS:
        estimated = True  # Once, past the compilation and the first batches.
        _say_pace(logged_step, metrics, config)
    bar.update(logged_step, {k: v for k, v in metrics.items()
                             if k in ("train/loss", "perf/clips_per_s") or
                             (k == "data/skipped" and v)})

  def evaluate_and_log() -> dict:
    metrics = eval_sets.evaluate(run, config)
    writer.write(step, metrics)
    logging.info("%s", console.eval_table(step, metrics))
    return metrics

  # Closed on the way out, on an error too: the pipeline's workers stop, and
  # a save in flight finishes (Orbax moves a save into place once whole).
  with (monitor.MetricWriter(workdir) as writer,
        checkpoint.Checkpointer.from_config(
            workdir, config, metadata={"config": config.to_dict()}) as ckpt):
    # ----------------------------------------------------------------- data
    with (contextlib.closing(pipeline.make_pipeline(
              config, run.mesh, train=True, batch_size=config.batch_size,
              tokenizer=run.tokenizer, records=run.train_records,
              state=run.data_state)) as train_batches,
          resume.PreemptionHandler() as preemption, bar):
      # --------------------------------------------------------------- loop
      while step < config.total_steps:
        with timer.waiting_for_data():
          batch = next(train_batches)
        run.state, metrics = run.steps.train(run.state, run.rest, batch,
                                             base_key)
        step += 1
        timer.step()
        if step == first_step + 1:
          jax.block_until_ready(run.state)
          timer.reset()  # The first step compiled; don't count it.
        log(late.push(step, metrics))
        stop = preemption.should_stop(step)
        final = step == config.total_steps
        evaluating = eval_every and step % eval_every == 0 and not final
        if stop or final or evaluating or ckpt.should_save(step):
          # No checkpoint may hold non-finite weights: this step's metrics
          # (its loss and gradient norm) first, one wait for the device per
          # save; `log` sees them only a step later.
          monitor.check_finite(monitor.to_python(metrics), step=step,
                               last_checkpoint_step=last_saved)
        if ckpt.save(step, run.state, data_state=train_batches.get_state(),
                     rng=base_key, force=stop or final):
          last_saved = step
        if stop:
          preempted = True
          break
        if evaluating:
          last_eval = evaluate_and_log()
          ckpt.record_eval(step, last_eval, run.state, rng=base_key,
                           data_state=train_batches.get_state())
      log(late.flush())
    _say_read_failures(train_batches.failures)
    if step >= config.total_steps:
      last_eval = evaluate_and_log()
      ckpt.record_eval(step, last_eval, run.state)  # The final step is saved.
    ckpt.wait_until_finished()
    saved_steps = ckpt.all_steps()
  if jax.process_index() == 0:
    # Imported here: matplotlib is needed for the plots only.
    from vidjax import plot  # pylint: disable=import-outside-toplevel
    plots = plot.plot_run(workdir)  # WORKDIR/plots/*.png
    logging.info("%s", console.end_message(workdir, step, config.total_steps,
                                           plots, saved_steps))
  if preempted:
    if jax.process_count() > 1:  # Nobody exits (75) before every save is done.
      multihost_utils.sync_global_devices("vidjax:preempted")
    raise errors.Preempted(step, checkpoint.checkpoint_dir(workdir))
  return last_eval


def _say_pace(step: int, metrics: dict, config) -> None:
  """The time estimate; the data-bound warning when batches keep the devices waiting."""
  if "perf/step_time_s" not in metrics:
    return
  logging.info("%s", console.time_estimate(step, config.total_steps,
                                           metrics["perf/step_time_s"]))
  if metrics.get("perf/data_wait_frac", 0.0) > DATA_BOUND_FRACTION:
    logging.warning("%s", console.data_bound_warning(
        metrics["perf/data_wait_frac"], config.data))


def _say_read_failures(failures) -> None:
  """The end-of-training summary of clips that could not be read, per file."""
  if failures:
    logging.warning(
        "%d clip reads failed in %d file%s during training (other clips were "
        "read instead):\n  %s", sum(failures.values()), len(failures),
        "s" if len(failures) > 1 else "",
        "\n  ".join(batches.failure_lines(failures)))
