"""The training loop, top to bottom: one generic loop for every task.

    train_and_evaluate(config, workdir)   # what `python -m vidjax.main` calls

Sections: setup -> data -> model and optimizer (created already sharded) ->
resume -> jitted steps -> loop (log one step late, checkpoint, preemption,
eval) -> final eval. The train state is a dict {step, params, opt}; model
buffers that never train (`rest`) are rebuilt from the config at start-up.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from absl import logging
import flax.nnx as nnx
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.experimental import multihost_utils

from vidjax import augment, checkpoint, config as config_lib, console, errors
from vidjax import eval_sets, logging as log_lib, models, optim, sharding, tasks
from vidjax.data import checks, pipeline, synthetic
from vidjax.models import clip as clip_lib, flops as flops_lib, loader, weights

# Steps after the start before the time estimate and the data-bound check.
ESTIMATE_AFTER_STEPS = 10
DATA_BOUND_FRACTION = 0.5  # Of the wall time spent waiting for batches.


def _clamp_logit_scale(params):
  # CLIP/AVION clamp the learned temperature after each update (<= 100).
  def clamp(path, x):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    return jnp.clip(x, 0.0, clip_lib.MAX_LOGIT_SCALE) if "logit_scale" in name else x
  return jax.tree_util.tree_map_with_path(clamp, params)


def _microbatches(batch: dict, accum: int) -> dict:
  """[B, ...] -> [accum, B/accum, ...], microbatch a = examples a, a+accum, ...

  Strided so that each device's contiguous shard of the batch holds an equal
  part of every microbatch: no data moves between devices.
  """
  return jax.tree.map(
      lambda x: jnp.moveaxis(x.reshape((-1, accum) + x.shape[1:]), 1, 0), batch)


def _accumulate(grad_fn, accum: int, params, rest, batch, key):
  """grad_fn over `accum` microbatches of the batch, averaged (lax.scan)."""
  if accum == 1:
    return grad_fn(params, rest, batch, key)
  micro = _microbatches(batch, accum)
  keys = jax.random.split(key, accum)
  shapes = jax.eval_shape(grad_fn, params, rest,
                          jax.tree.map(lambda x: x[0], micro), keys[0])
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def add(total, xs):
    return jax.tree.map(jnp.add, total, grad_fn(params, rest, *xs)), None

  total, _ = jax.lax.scan(add, zeros, (micro, keys))
  return jax.tree.map(lambda x: x / accum, total)


@dataclasses.dataclass
class Steps:
  """The jitted functions of a run, closed over the model structure.

  `loss(params, rest, batch, key) -> (loss, metrics)` is what `train`
  differentiates, on one raw batch (augmented inside), unjitted: for memory
  analysis (`vidjax.bench.memory`).
  """
  train: callable
  eval: callable
  loss: callable
  text: callable = None  # tokens -> text embeddings (captions, `eval_sets`)


def make_steps(config, task, graphdef, tx, schedule, mesh,
               shardings) -> Steps:
  """The jitted train and eval steps, pinned to the state's shardings.

  Explicit in and out shardings (those `sharding.create_sharded_state`
  returned for (state, rest)) keep every step's state laid out as the
  first: without them XLA may hand back a small replicated leaf sharded,
  and the next call compiles the step again.
  """
  accum = config.accum_steps
  # Frames leave the augment in the compute dtype (bf16 on GPU): the model
  # casts them anyway, and half the bytes cross HBM. A config's own
  # augment.dtype wins.
  aug = {"dtype": jnp.dtype(models.resolve_dtype(config.model.dtype)).name,
         **task.augment_config(config)}
  train_augment = augment.make_augment(aug)
  eval_augment = augment.make_augment(
      {k: v for k, v in aug.items()
       if k in ("mean", "std", "dtype", "mask_ratio", "tubelet", "patch")})

  def loss_fn(params, rest, batch, key):
    model = nnx.merge(graphdef, params, rest)
    return task.loss(model, batch, key, config)

  def train_step(state, rest, batch, base_key):
    key = jax.random.fold_in(base_key, state["step"])
    aug_key, drop_key = jax.random.split(key)
    batch = train_augment(batch, aug_key)
    (loss, metrics), grads = _accumulate(
        jax.value_and_grad(loss_fn, has_aux=True), accum, state["params"],
        rest, batch, drop_key)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    params = _clamp_logit_scale(optax.apply_updates(state["params"], updates))
    metrics = {f"train/{k}": v for k, v in metrics.items()}
    metrics.update({"train/loss": loss, "train/grad_norm": optax.global_norm(grads),
                    "train/lr": schedule(state["step"])})
    return {"step": state["step"] + 1, "params": params, "opt": opt}, metrics

  def eval_step(params, rest, batch):
    batch = eval_augment(batch, jax.random.key(0))
    out = task.eval_outputs(nnx.merge(graphdef, params, rest), batch)
    keep = ("index", "view", "valid", "label", "verb", "noun")
    return {**out, **{k: v for k, v in batch.items() if k in keep}}

  def text_step(params, rest, tokens):
    return nnx.merge(graphdef, params, rest).encode_text(tokens)

  def raw_batch_loss(params, rest, batch, key):
    aug_key, drop_key = jax.random.split(key)
    return loss_fn(params, rest, train_augment(batch, aug_key), drop_key)

  state_shardings, rest_shardings = shardings
  batch, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  return Steps(
      loss=raw_batch_loss,
      train=jax.jit(train_step, donate_argnums=0,
                    in_shardings=(state_shardings, rest_shardings, batch,
                                  replicated),
                    out_shardings=(state_shardings, replicated)),
      eval=jax.jit(eval_step,
                   in_shardings=(state_shardings["params"], rest_shardings,
                                 batch),
                   out_shardings=batch),
      text=jax.jit(text_step))


def build_state_and_steps(config, task, mesh, *, abstract: bool = False):
  """The train state (created sharded), model buffers and jitted steps.

  Args:
    config: the run config (`model`, `optim`, `total_steps`, `seed`, ...).
    task: the task module (`tasks.get_task(config.task)`).
    mesh: from `sharding.make_mesh`.
    abstract: return `jax.ShapeDtypeStruct`s (with shardings) instead of
      arrays: nothing is computed or allocated, and the steps can still be
      traced, lowered or compiled for them.

  Returns:
    (state, rest, steps): state {step, params, opt}, the model's untrained
    buffers, and the `Steps`.
  """
  tx, schedule = optim.make_optimizer(config.optim, config.total_steps)

  def build():
    return models.build_model(config.model, rngs=nnx.Rngs(config.seed))

  def init():
    _, params, rest = nnx.split(build(), nnx.Param, ...)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt": tx.init(params)}, rest

  graphdef = nnx.split(nnx.eval_shape(build), nnx.Param, ...)[0]
  if abstract:
    state, rest = sharding.abstract_sharded_state(init, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, (state, rest))
  else:
    (state, rest), shardings = sharding.create_sharded_state(init, mesh)
  steps = make_steps(config, task, graphdef, tx, schedule, mesh, shardings)
  return state, rest, steps


def run_eval(run: "Run", config) -> dict:
  """Runs every evaluation set once (`vidjax.eval_sets`); `eval/...` metrics."""
  return eval_sets.evaluate_all(run, config)


@dataclasses.dataclass
class Run:
  """What a run is built from: devices, task, state, jitted steps."""
  mesh: jax.sharding.Mesh
  task: object
  tokenizer: object
  state: dict
  rest: object
  steps: Steps
  data_state: object = None
  workdir: Path | None = None  # Where evaluations save embeddings.
  train_records: list | None = None  # Checked rows; None: from the file.


def _start_text(start: checkpoint.StartPoint) -> str:
  return {"workdir": f"resuming at step {start.step}",
          "resume": f"resuming {start.path} at step {start.step}",
          "init_from": f"parameters from {start.path}"}.get(start.kind,
                                                            "from scratch")


def setup(config: ml_collections.ConfigDict, workdir: Path, *,
          splits: tuple[str, ...] = ()) -> Run:
  """Config, data, model and optimizer state (sharded), resume point.

  Everything a user can get wrong is checked before the workdir is touched:
  the config, the data paths, the vocabulary, the annotation files of
  `splits` ('train', 'eval'; none for tools on synthetic batches) and
  whether a checkpoint to resume fits the model. Then WORKDIR/config.json
  and WORKDIR/log.txt are written and half-written checkpoints removed.
  """
  config_lib.validate(config, jax.device_count())
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  task = tasks.get_task(config.task)
  synthetic.prepare(config, workdir)
  if splits:
    keys = [k for k in eval_sets.required_paths(config, needs_text=False)
            if "train" in splits or not k.startswith("data.train_")]
    checks.check_paths(config, keys)
    if "eval" in splits:
      eval_sets.check_files(config)
  tokenizer = checks.load_tokenizer(config) if task.NEEDS_TEXT else None
  reports = checks.check_annotations(
      config, splits, needs_text=task.NEEDS_TEXT,
      needs_label=config.task == "classification") if splits else {}
  if "train" in reports:  # `*_epochs` keys count epochs of these records.
    config_lib.epochs_to_steps(config, len(reports["train"].kept_records()))

  start = checkpoint.resolve_start(workdir, config)
  if start.kind in ("workdir", "resume"):
    checkpoint.check_fits(
        start, build_state_and_steps(config, task, mesh, abstract=True)[0],
        config)
  # --- The run is accepted: from here on the workdir is written.
  if reports:
    checks.report(reports, config, workdir)
  checkpoint.remove_partial_saves(workdir)
  if "train" in splits or not splits:  # An evaluation keeps the run's own.
    config_lib.save_config_json(config, workdir)
  if jax.process_index() == 0:
    console.attach_log_file(workdir)
  state, rest, steps = build_state_and_steps(config, task, mesh)
  run = Run(mesh, task, tokenizer, state, rest, steps, workdir=workdir)
  if "train" in reports:
    run.train_records = reports["train"].kept_records()

  if start.kind in ("workdir", "resume"):
    restored = checkpoint.restore_checkpoint(start.path, state, step=start.step)
    run.state, run.data_state = restored.state, restored.data_state
    logging.info("resumed from %s at step %d", start.path, restored.step)
  elif start.kind == "init_from":  # Parameters only, onto their shardings.
    source = weights.read_source(
        start.path, allow_pickle=config.init_allow_pickle)
    params, report = loader.load_params(
        state["params"], config.model, source,
        keep_init=tuple(config.init_keep))
    report.log(workdir)  # Also WORKDIR/init_from.json.
    run.state = dict(state, params=params)
  if splits:
    _log_summary(run, config, reports, start)
  return run


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
  """Evaluates without training: the workdir's latest checkpoint, else
  `resume`, else `init_from` (released or vidjax weights: zero-shot)."""
  workdir = Path(workdir)
  if checkpoint.resolve_start(workdir, config).kind == "scratch":
    raise errors.WorkdirError(
        f"{workdir} has no checkpoint to evaluate",
        hint="check the --workdir path, or evaluate other weights with "
        "--config.init_from=PATH (or --config.resume=RUN_DIR)")
  run = setup(config, workdir, splits=("eval",))
  metrics = run_eval(run, config)
  with log_lib.MetricWriter(workdir) as writer:
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
  state, rest, steps = run.state, run.rest, run.steps
  first_step = int(state["step"])
  writer = log_lib.MetricWriter(workdir)

  # ------------------------------------------------------------------- data
  train_batches = pipeline.make_pipeline(
      config, run.mesh, train=True, batch_size=config.batch_size,
      tokenizer=run.tokenizer, records=run.train_records)
  if run.data_state is not None:
    train_batches = train_batches.restored(run.data_state)

  # ------------------------------------------------------------------- loop
  base_key = jax.random.key(config.seed)
  ckpt = checkpoint.Checkpointer.from_config(
      workdir, config, metadata={"config": config.to_dict()})
  flops = flops_lib.flops_per_example(config.model)["training"]
  timer = log_lib.StepTimer(
      global_batch=config.batch_size, flops_per_step=flops * config.batch_size,
      peak_flops_per_device=config.peak_tflops * 1e12 or
      log_lib.peak_flops_per_device())
  late = log_lib.LateMetrics()
  bar = log_lib.ProgressBar(config.total_steps, first_step)
  eval_every = config.eval.every_steps
  last_eval, last_saved, step = {}, first_step or None, first_step
  preempted, estimated = False, False

  def log(item):
    nonlocal estimated
    if item is None:
      return
    logged_step, metrics = item
    log_lib.check_finite(metrics, step=logged_step,
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

  with checkpoint.PreemptionHandler() as preemption, bar:
    while step < config.total_steps:
      with timer.waiting_for_data():
        batch = next(train_batches)
      state, metrics = steps.train(state, rest, batch, base_key)
      step += 1
      timer.step()
      if step == first_step + 1:
        jax.block_until_ready(state)
        timer.reset()  # The first step compiled; don't count it.
      log(late.push(step, metrics))
      stop = preemption.should_stop(step)
      if ckpt.save(step, state, data_state=train_batches.get_state(),
                   rng=base_key, force=stop or step == config.total_steps):
        last_saved = step
      if stop:
        preempted = True
        break
      if eval_every and step % eval_every == 0 and step < config.total_steps:
        run.state = state
        last_eval = run_eval(run, config)
        writer.write(step, last_eval)
        ckpt.record_eval(step, last_eval, state, rng=base_key,
                         data_state=train_batches.get_state())
        logging.info("%s", console.eval_table(step, last_eval))
  log(late.flush())
  bar.close()
  train_batches.close()
  _say_read_failures(train_batches.host.failures)
  run.state = state
  if step >= config.total_steps:
    last_eval = run_eval(run, config)
    writer.write(step, last_eval)
    ckpt.record_eval(step, last_eval, state)  # The final step is saved.
    logging.info("%s", console.eval_table(step, last_eval))
  ckpt.wait_until_finished()
  saved_steps = ckpt.all_steps()
  ckpt.close()
  writer.close()
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
        "\n  ".join(pipeline.failure_lines(failures)))
