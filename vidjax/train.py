"""The training loop, top to bottom: one generic loop for every task.

    train_and_evaluate(config, workdir)   # what `python -m vidjax.main` calls

Sections: setup -> data -> model and optimizer (created already sharded) ->
resume -> jitted steps -> loop (log one step late, checkpoint, preemption,
eval) -> final eval. The train state is a dict {step, params, opt}; model
buffers that never train (`rest`) are rebuilt from the config at start-up.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from absl import logging
import flax.nnx as nnx
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.experimental import multihost_utils

from vidjax import augment, checkpoint, config as config_lib, eval_sets, models
from vidjax import logging as log_lib, optim, sharding, tasks
from vidjax.data import pipeline, synthetic, synthetic_annotations
from vidjax.data import tokenizer as tokenizer_lib
from vidjax.models import clip as clip_lib, flops as flops_lib, loader, weights


def prepare_synthetic(config: ml_collections.ConfigDict, workdir: Path):
  """Writes the synthetic corpus under the workdir and points the data at it.

  Process 0 writes it; the others wait, then find it complete (shared
  workdir) or write their own copy (per-machine workdir).
  """
  spec, root = config.data.synthetic, workdir / "synthetic"

  def make():
    synthetic.make_corpus(
        root, num_videos=spec.num_videos,
        segments_per_video=spec.segments_per_video,
        segment_seconds=spec.segment_seconds, height=spec.height,
        width=spec.width, seed=spec.seed, progress=jax.process_index() == 0)
    if not config.data.vocab and not (root / "vocab.txt.gz").exists():
      synthetic.write_vocab(root / "vocab.txt.gz")

  if jax.process_index() == 0:
    make()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("vidjax:synthetic corpus")
    if jax.process_index() != 0:
      make()
  synthetic_annotations.use_corpus(config, root)


def check_paths(config: ml_collections.ConfigDict, needs_text: bool,
                keys: list[str] | None = None):
  """Stops at start-up, naming every data path that is unset or missing."""
  check_all = keys is None
  if check_all:
    keys = eval_sets.required_paths(config, needs_text)
  problems = []
  for key in keys:
    value = functools.reduce(lambda node, part: node[part], key.split("."),
                             config)
    for path in pipeline.split_paths(value) or [value]:  # a,b: several files
      if not path or not os.path.exists(path):
        problems.append(f"  {key} = {path!r} ({'unset' if not path else 'not found'});"
                        f" set it with --config.{key}=PATH")
  if problems:
    raise ValueError("data paths to fix:\n" + "\n".join(problems))
  if check_all:
    eval_sets.check_files(config)


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
  accum = config.get("accum_steps", 1)
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


def setup(config: ml_collections.ConfigDict, workdir: Path) -> Run:
  """Mesh, data paths, model and optimizer state (sharded), resume point."""
  workdir.mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(fsdp=config.get("fsdp", 1))
  config_lib.validate(config, jax.device_count())
  task = tasks.get_task(config.task)
  if config.data.get("synthetic", None) and config.data.synthetic.enabled:
    prepare_synthetic(config, workdir)
  config_lib.save_config_json(config, workdir)
  if task.NEEDS_TEXT:
    check_paths(config, True, keys=["data.vocab"])
  tokenizer = (tokenizer_lib.Tokenizer(config.data.vocab)
               if task.NEEDS_TEXT else None)
  if tokenizer and tokenizer.vocab_size > config.model.text.vocab_size:
    raise ValueError(f"{config.data.vocab} has {tokenizer.vocab_size} tokens "
                     f"but config.model.text.vocab_size is "
                     f"{config.model.text.vocab_size}; raise it")

  state, rest, steps = build_state_and_steps(config, task, mesh)
  run = Run(mesh, task, tokenizer, state, rest, steps, workdir=workdir)

  start = checkpoint.resolve_start(workdir, config)
  if start.kind in ("workdir", "resume"):
    restored = checkpoint.restore_checkpoint(start.path, state, step=start.step)
    run.state, run.data_state = restored.state, restored.data_state
    logging.info("resumed from %s at step %d", start.path, restored.step)
  elif start.kind == "init_from":  # Parameters only, onto their shardings.
    source = weights.read_source(
        start.path, allow_pickle=config.get("init_allow_pickle", False))
    params, report = loader.load_params(
        state["params"], config.model, source,
        keep_init=tuple(config.get("init_keep", ())))
    report.log(workdir)  # Also WORKDIR/init_from.json.
    run.state = dict(state, params=params)
  return run


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates without training: the workdir's latest checkpoint, else
  `resume`, else `init_from` (released or vidjax weights: zero-shot)."""
  workdir = Path(workdir)
  run = setup(config, workdir)
  check_paths(config, run.task.NEEDS_TEXT)
  metrics = run_eval(run, config)
  with log_lib.MetricWriter(workdir) as writer:
    writer.write(int(run.state["step"]), metrics)
  logging.info("eval at step %d: %s", int(run.state["step"]), metrics)
  return metrics


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming if the workdir has a checkpoint) and evaluates.

  Returns:
    The last evaluation's metrics.
  """
  # ------------------------------------------------------------------ setup
  workdir = Path(workdir)
  run = setup(config, workdir)
  check_paths(config, run.task.NEEDS_TEXT)
  state, rest, steps = run.state, run.rest, run.steps
  first_step = int(state["step"])
  writer = log_lib.MetricWriter(workdir)

  # ------------------------------------------------------------------- data
  train_batches = pipeline.make_pipeline(
      config, run.mesh, train=True, batch_size=config.batch_size,
      tokenizer=run.tokenizer)
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
  last_eval, last_saved, step = {}, first_step, first_step

  def log(item):
    if item is None:
      return
    logged_step, metrics = item
    log_lib.check_finite(metrics, step=logged_step,
                         last_checkpoint_step=last_saved)
    if logged_step % config.log.every_steps == 0 or logged_step == config.total_steps:
      metrics.update(timer.summary())
      metrics["data/skipped"] = train_batches.skipped
      writer.write(logged_step, metrics)
    bar.update(logged_step, {k: v for k, v in metrics.items()
                             if k in ("train/loss", "perf/clips_per_s")})

  with checkpoint.PreemptionHandler() as preemption:
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
        logging.warning("preempted: saved step %d; rerun the same command "
                        "to resume", step)
        break
      if eval_every and step % eval_every == 0 and step < config.total_steps:
        run.state = state
        last_eval = run_eval(run, config)
        writer.write(step, last_eval)
        ckpt.record_eval(step, last_eval, state, rng=base_key,
                         data_state=train_batches.get_state())
  log(late.flush())
  bar.close()
  train_batches.close()
  run.state = state
  if step >= config.total_steps:
    last_eval = run_eval(run, config)
    writer.write(step, last_eval)
    ckpt.record_eval(step, last_eval, state)  # The final step is saved.
    logging.info("final eval at step %d: %s", step, last_eval)
  ckpt.close()
  writer.close()
  if jax.process_index() == 0:
    # Imported here: matplotlib is needed for the plots only.
    from vidjax import plot  # pylint: disable=import-outside-toplevel
    plot.plot_run(workdir)  # WORKDIR/plots/*.png
  return last_eval
