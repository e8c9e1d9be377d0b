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
import numpy as np
import optax
from jax.experimental import multihost_utils

from vidjax import augment, checkpoint, config as config_lib, console, errors
from vidjax import logging as log_lib, models, optim, plot, sharding, tasks
from vidjax.data import checks, pipeline, synthetic
from vidjax.models import clip as clip_lib, flops as flops_lib, weights

# Steps after the start before the time estimate and the data-bound check.
ESTIMATE_AFTER_STEPS = 10
DATA_BOUND_FRACTION = 0.5  # Of the wall time spent waiting for batches.


def load_pretrained(path: str, model_config, params, keep_init=()):
  """Parameters from released weights (`config.init_from`), placed like `params`.

  OpenAI/OpenCLIP CLIP (.pt, .safetensors, .npz) for 'clip' and for a
  'classifier' with a CLIP backbone; VideoMAE checkpoints (original or
  Hugging Face naming) for 'videomae' and 'classifier'. Sizes come from the
  file; they must match `config.model` (the error lists what differs),
  except for the CLIP parameters named in `keep_init` (`config.init_keep`,
  e.g. the projections when `embed_dim` differs), which keep their init.
  """
  name, kw = model_config.name, models.model_kwargs(model_config)
  keep = ("image_size", "num_frames", "tubelet", "dtype", "attention", "remat",
          "scan", "drop_path")
  overrides = {k: kw[k] for k in keep if k in kw}
  state_dict = weights.load_state_dict(path)
  if name == "clip":
    overrides.update(act=kw["act"], learn_logit_scale=kw["learn_logit_scale"],
                     embed_dim=kw["embed_dim"],
                     logit_scale_init=kw["logit_scale_init"])
    model = weights.clip_from_state_dict(state_dict, keep_init=tuple(keep_init),
                                         **overrides)
  elif name == "videomae":
    model = weights.videomae_from_state_dict(state_dict, **overrides)
  else:
    model = weights.classifier_from_state_dict(
        state_dict, num_classes=kw["num_classes"], **overrides)
  loaded = nnx.split(model, nnx.Param, ...)[1]
  want = jax.tree.map(lambda x: (x.shape, x.dtype), params)
  got = jax.tree.map(lambda x: (x.shape, x.dtype), loaded)
  if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
    diff = sorted({str(k) for k in (set(_flat(want).items()) ^
                                    set(_flat(got).items()))})[:10]
    raise ValueError(f"config.init_from={path}: the weights do not fit "
                     f"config.model (first differences: {diff})")
  return jax.tree.map(lambda new, old: jax.device_put(new, old.sharding),
                      loaded, params)


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(k): v
          for k, v in jax.tree_util.tree_leaves_with_path(tree,
                                                          is_leaf=lambda x: isinstance(x, tuple))}


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
  """The jitted functions of a run, closed over the model structure."""
  train: callable
  eval: callable


def make_steps(config, task, graphdef, tx, schedule) -> Steps:
  accum = config.get("accum_steps", 1)
  train_augment = augment.make_augment(task.augment_config(config))
  eval_cfg = {k: v for k, v in task.augment_config(config).items()
              if k in ("mean", "std", "dtype", "mask_ratio", "tubelet", "patch")}
  eval_augment = augment.make_augment(eval_cfg)

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

  return Steps(train=jax.jit(train_step, donate_argnums=0),
               eval=jax.jit(eval_step))


def run_eval(run: "Run", config) -> dict:
  """Runs the evaluation set once; returns `eval/...` metrics."""
  batches = pipeline.make_pipeline(
      config, run.mesh, train=False, batch_size=config.eval.batch_size,
      tokenizer=run.tokenizer)
  outputs = []
  for batch in batches:
    out = run.steps.eval(run.state["params"], run.rest, batch)
    outputs.append(jax.tree.map(np.asarray,
                                multihost_utils.process_allgather(out, tiled=True)))
  skipped = batches.skipped
  batches.close()
  merged = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  metrics = run.task.evaluate(merged, config)
  return {**{f"eval/{k}": v for k, v in metrics.items()}, "eval/skipped": skipped}


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
  mesh = sharding.make_mesh(fsdp=config.get("fsdp", 1))
  task = tasks.get_task(config.task)
  synthetic.prepare(config, workdir)
  if splits:
    keys = ["data.root"] + [f"data.{s}_annotations" for s in splits]
    keys += ["eval.relevancy"] if "eval" in splits and config.eval.get(
        "relevancy", "") else []
    checks.check_paths(config, keys)
  tokenizer = checks.load_tokenizer(config) if task.NEEDS_TEXT else None
  reports = checks.check_annotations(
      config, splits, needs_text=task.NEEDS_TEXT,
      needs_label=config.task == "classification") if splits else {}

  tx, schedule = optim.make_optimizer(config.optim, config.total_steps)

  def build():
    return models.build_model(config.model, rngs=nnx.Rngs(config.seed))

  def init():
    _, params, rest = nnx.split(build(), nnx.Param, ...)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt": tx.init(params)}, rest

  graphdef = nnx.split(nnx.eval_shape(build), nnx.Param, ...)[0]
  start = checkpoint.resolve_start(workdir, config)
  if start.kind in ("workdir", "resume"):
    checkpoint.check_fits(start, jax.eval_shape(init)[0], config)
  # --- The run is accepted: from here on the workdir is written.
  if reports:
    checks.report(reports, config, workdir)
  checkpoint.remove_partial_saves(workdir)
  if "train" in splits or not splits:  # An evaluation keeps the run's own.
    config_lib.save_config_json(config, workdir)
  if jax.process_index() == 0:
    console.attach_log_file(workdir)
  (state, rest), _ = sharding.create_sharded_state(init, mesh)
  run = Run(mesh, task, tokenizer, state, rest,
            make_steps(config, task, graphdef, tx, schedule))
  if "train" in reports:
    run.train_records = reports["train"].kept_records()

  if start.kind in ("workdir", "resume"):
    restored = checkpoint.restore_checkpoint(start.path, state, step=start.step)
    run.state, run.data_state = restored.state, restored.data_state
    logging.info("resumed from %s at step %d", start.path, restored.step)
  elif start.kind == "init_from":
    run.state = dict(state, params=load_pretrained(
        start.path, config.model, state["params"],
        keep_init=config.get("init_keep", ())))
    logging.info("initialised parameters from %s", start.path)
  if splits:
    _log_summary(run, config, reports, start)
  return run


def _log_summary(run: Run, config, reports: dict, start) -> None:
  """The start-up summary; a warning when the batch is larger than the data."""
  num_params = sum(x.size for x in jax.tree.leaves(run.state["params"]))
  clips = {s: len(r.kept_records()) for s, r in reports.items()}
  logging.info("%s", console.run_summary(
      devices=jax.devices(), batch_size=config.batch_size,
      accum_steps=config.get("accum_steps", 1), num_params=num_params,
      clips=clips, total_steps=config.total_steps,
      first_step=int(run.state["step"]), start=_start_text(start)))
  if "train" in clips and config.batch_size > clips["train"]:
    logging.warning("batch_size=%d is larger than the %d training clips: every "
                    "batch repeats clips; lower --config.batch_size",
                    config.batch_size, clips["train"])


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates the workdir's latest checkpoint (or `resume`/`init_from`)."""
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
      peak_flops_per_device=config.get("peak_tflops", 0.0) * 1e12 or
      log_lib.peak_flops_per_device())
  late = log_lib.LateMetrics()
  bar = log_lib.ProgressBar(config.total_steps, first_step)
  eval_every = config.eval.get("every_steps", 0)
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
        logging.info("%s", console.eval_table(step, last_eval))
  log(late.flush())
  bar.close()
  train_batches.close()
  ckpt.wait_until_finished()
  saved_steps = ckpt.all_steps()
  ckpt.close()
  _say_read_failures(train_batches.host.failures)
  run.state = state
  if step >= config.total_steps:
    last_eval = run_eval(run, config)
    writer.write(step, last_eval)
    logging.info("%s", console.eval_table(step, last_eval))
  writer.close()
  if jax.process_index() == 0:
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
