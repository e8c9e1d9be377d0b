"""The jitted steps of a run and the sharded state they update.

    state, rest, steps = build_state_and_steps(config, task, mesh)
    state, metrics = steps.train(state, rest, batch, key)  # one optimizer step
    outputs = steps.eval(state["params"], rest, batch)      # one eval batch

A CLIP trained with masking (`model.mask_ratio`) has two training steps:
`steps.train` on the kept video tokens, and from step `unmask_start(config)`
on, the unmasked tuning's (`steps.unmasked_train`, compiled when first
called) on every token; `steps.train_at(step)` is the one to run from a
state at `step`. The step number alone decides, so a run resumed on either
side of the switch runs what the uninterrupted run ran; the tuning's own
learning rate (`unmask_lr`, `unmask_warmup_steps`) is the optimizer's
schedule joined at that step, and its microbatches `unmask_accum_steps`.

`accum_steps` > 1 splits a step into microbatches at the same global batch.
A loss that is a mean over examples (classification, VideoMAE) averages the
microbatches' gradients; a loss that couples the batch (contrastive, MIR:
`tasks.EmbeddingTask`) stays the whole batch's by GradCache
(`_cached_accumulate`): one more forward pass, memory for one microbatch
plus the batch's embeddings.

The train state is a dict {step, params, opt}, created already sharded (see
`sharding.create_sharded_state`); model buffers that never train (`rest`)
are rebuilt from the config. Both steps augment the raw uint8 batch on the
device (`vidjax.augment`, with the task's training or evaluation keys).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import optax

from vidjax import augment, models, optim, sharding, tasks
from vidjax.base import keypaths
from vidjax.models import clip as clip_lib, spec as spec_lib
from vidjax.tasks import Task

# The batch keys every evaluation keeps beside the task's outputs: the record
# and view of each row, and whether it is padding.
EVAL_KEYS = ("index", "view", "valid")


def _clamp_logit_scale(params):
  # CLIP/AVION clamp the learned temperature after each update (<= 100).
  def clamp(path, x):
    if "logit_scale" not in keypaths.name(path):
      return x
    return jnp.clip(x, 0.0, clip_lib.MAX_LOGIT_SCALE)

  return jax.tree_util.tree_map_with_path(clamp, params)


def _microbatches(batch: dict, accum: int) -> dict:
  """[B, ...] -> [accum, B/accum, ...], microbatch a = examples a, a+accum, ...

  Strided so that each device's contiguous shard of the batch holds an equal
  part of every microbatch: no data moves between devices.
  """
  return jax.tree.map(
    lambda x: jnp.moveaxis(x.reshape((-1, accum) + x.shape[1:]), 1, 0), batch
  )


def _whole_batch(micro: dict) -> dict:
  """The inverse of `_microbatches`: [accum, B/accum, ...] -> [B, ...]."""
  return jax.tree.map(
    lambda x: jnp.moveaxis(x, 0, 1).reshape((-1,) + x.shape[2:]), micro
  )


def _accumulate(grad_fn, accum: int, params, rest, batch, key):
  """grad_fn over `accum` microbatches of the batch, averaged (lax.scan).

  For a loss that is a mean over examples (classification, VideoMAE): the
  average of the microbatches' gradients is the whole batch's.
  """
  if accum == 1:
    return grad_fn(params, rest, batch, key)
  micro = _microbatches(batch, accum)
  keys = jax.random.split(key, accum)
  shapes = jax.eval_shape(
    grad_fn, params, rest, jax.tree.map(lambda x: x[0], micro), keys[0]
  )
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def add(total, xs):
    return jax.tree.map(jnp.add, total, grad_fn(params, rest, *xs)), None

  total, _ = jax.lax.scan(add, zeros, (micro, keys))
  return jax.tree.map(lambda x: x / accum, total)


def _cached_accumulate(embed_fn, head_fn, accum: int, params, rest, batch, key):
  """The loss over the whole batch, its gradient computed in microbatches.

  GradCache (Gao et al., 2021; OpenCLIP's `--accum-freq`), for a loss that
  couples the batch's examples (InfoNCE's negatives, max-margin ranking):
  every microbatch is embedded without gradients, the loss runs on all the
  embeddings at once, and each microbatch is then embedded again with
  gradients and back-propagates its share of the loss's gradient with
  respect to the embeddings (a vjp). The gradients equal the unsplit
  batch's at the cost of one more forward pass; memory holds one
  microbatch's activations plus the whole batch's embeddings.

  Args:
    embed_fn: (params, rest, batch [b, ...], key) -> embeddings {name: [b, D]}.
    head_fn: (params, rest, embeddings [B, D], batch [B, ...]) -> (loss,
      metrics): the loss on the whole batch's embeddings (the parameters
      for what it learns itself, e.g. CLIP's temperature).
    accum, params, rest, batch, key: as `_accumulate` (microbatch a's key
      is `split(key, accum)[a]`, in both passes).

  Returns:
    ((loss, metrics), grads), as `jax.value_and_grad(..., has_aux=True)`.
  """
  micro = _microbatches(batch, accum)
  keys = jax.random.split(key, accum)
  # The parameters enter the loop as its carry, not closed over: a model
  # merged inside the loop from values of the trace outside it cannot run
  # nnx.remat's blocks (flax's TraceContextError), so a remat policy
  # failed to trace with accumulation (found compiling every recipe).
  _, cached = jax.lax.scan(
    lambda carried, xs: (carried, embed_fn(*carried, *xs)),
    (params, rest),
    (micro, keys),
  )
  (loss, metrics), (grads, cotangents) = jax.value_and_grad(
    head_fn, argnums=(0, 2), has_aux=True
  )(params, rest, _whole_batch(cached), batch)

  def add(total, xs):
    batch, key, cotangent = xs
    _, vjp = jax.vjp(lambda p: embed_fn(p, rest, batch, key), params)
    return jax.tree.map(jnp.add, total, vjp(cotangent)[0]), None

  cotangents = _microbatches(cotangents, accum)
  grads, _ = jax.lax.scan(add, grads, (micro, keys, cotangents))
  return (loss, metrics), grads


def caches_embeddings(config, accum: int | None = None) -> bool:
  """Whether the run's step is `_cached_accumulate`'s: a task whose loss
  couples the batch (it has `embed`), in more than one microbatch (`accum`,
  default `config.accum_steps`). Its step runs the towers' forward pass
  twice (4x, not 3x, the FLOPs)."""
  task = tasks.get_task(config.task)
  accum = config.accum_steps if accum is None else accum
  return accum > 1 and isinstance(task, tasks.EmbeddingTask)


def unmask_start(config) -> int | None:
  """The state step from which the unmasked tuning runs: the last
  `unmask_fraction` of `total_steps` (at least one step when > 0) train on
  every video token. None: the run never masks, or masks to its end."""
  model = config.model
  if model.name != "clip" or not model.mask_ratio > 0:
    return None
  tuning = config.unmask_fraction * config.total_steps
  if tuning <= 0:
    return None
  return config.total_steps - max(1, round(tuning))


def unmask_accum(config) -> int:
  """Microbatches of the unmasked tuning's step (`unmask_accum_steps`,
  0: `accum_steps`): the same global batch, more memory per clip."""
  return config.get("unmask_accum_steps") or config.accum_steps


def unmask_tuning(config) -> optim.Tuning | None:
  """The unmasked tuning's own learning rate (`unmask_lr` > 0, after
  `unmask_warmup_steps`), or None: the schedule runs on through it."""
  start = unmask_start(config)
  if start is None or not config.get("unmask_lr", 0) > 0:
    return None
  return optim.Tuning(
    start, float(config.unmask_lr), int(config.unmask_warmup_steps)
  )


Batch = dict[str, jax.Array]
TrainStep = Callable[
  [dict, Any, Batch, jax.Array], tuple[dict, dict[str, jax.Array]]
]


@dataclasses.dataclass
class Steps:
  """The jitted functions of a run, closed over the model structure.

  `loss(params, rest, batch, key) -> (loss, metrics)` is what `train`
  differentiates, on one raw batch (augmented inside), unjitted: for memory
  analysis (`benchmarks.memory`). With masked training and an unmasked
  tuning (module docstring), `unmasked_train` is the tuning's step and
  `unmask_start` its first step.
  """

  # (state, rest, batch, base_key) -> (state, metrics): the new train state
  # ({step, params, opt}, the old one donated) and the step's metrics.
  train: TrainStep
  # (params, rest, batch) -> per-example outputs and the batch's keys.
  eval: Callable[[Any, Any, Batch], dict[str, jax.Array]]
  loss: Callable[
    [Any, Any, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]
  ]
  # (params, rest, batch, key) -> ((loss, metrics), gradients): what
  # `train` applies, on one raw batch, unjitted; `accum_steps` microbatches.
  gradients: Callable[[Any, Any, Batch, jax.Array], tuple] | None = None
  # (params, rest, tokens) -> text embeddings (captions, `eval_sets`).
  text: Callable[[Any, Any, jax.Array], jax.Array] | None = None
  # An `EmbeddingTask`'s (params, rest, raw batch, key) -> the embeddings
  # the step caches under `accum_steps` > 1, unjitted (for memory).
  embed: Callable[[Any, Any, Batch, jax.Array], dict] | None = None
  unmasked_train: TrainStep | None = None
  unmask_start: int | None = None
  # A probe's (params, rest, raw eval batch) -> {features, label, index,
  # view, valid}: the frozen encoder's features it trains on
  # (`vidjax.evaluation.feature_cache`).
  features: Callable[[Any, Any, Batch], dict[str, jax.Array]] | None = None

  def train_at(self, step: int) -> TrainStep:
    """The training step to run from a state at `step`."""
    if self.unmask_start is not None and step >= self.unmask_start:
      return self.unmasked_train
    return self.train


def make_steps(
  config,
  task: Task,
  graphdef,
  tx,
  schedule,
  mesh,
  shardings,
  unmasked_graphdef=None,
) -> Steps:
  """The jitted train and eval steps, pinned to the state's shardings.

  Explicit in and out shardings (those `sharding.create_sharded_state`
  returned for (state, rest)) keep every step's state laid out as the
  first: without them XLA may hand back a small replicated leaf sharded,
  and the next call compiles the step again. `unmasked_graphdef`: the
  model's graph training on every token, for the unmasked tuning (then
  `graphdef` is the masked one's, which evaluation runs unmasked anyway).
  """
  # Frames leave the augment in the compute dtype (bf16 on GPU): the model
  # casts them anyway, and half the bytes cross HBM.
  dtype = {"dtype": jnp.dtype(models.resolve_dtype(config.model.dtype)).name}
  train_augment = augment.make_augment(
    {**dtype, **task.augment_config(config, train=True)}
  )
  eval_augment = augment.make_augment(
    {**dtype, **task.augment_config(config, train=False)}
  )

  def make_train_step(graphdef, accum: int):
    """(loss, embed, gradients, train step) of the model graph `graphdef`,
    in `accum` microbatches."""
    cache = caches_embeddings(config, accum)

    def loss_fn(params, rest, batch, key):
      model = nnx.merge(graphdef, params, rest)
      return task.loss(model, batch, key, config)

    def embed_fn(params, rest, batch, key):
      return task.embed(nnx.merge(graphdef, params, rest), batch, key, config)

    def head_fn(params, rest, embeddings, batch):
      model = nnx.merge(graphdef, params, rest)
      return task.embedded_loss(model, embeddings, batch, config)

    def gradients(params, rest, batch, key):
      if cache:
        return _cached_accumulate(
          embed_fn, head_fn, accum, params, rest, batch, key
        )
      grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
      return _accumulate(grad_fn, accum, params, rest, batch, key)

    def train_step(state, rest, batch, base_key):
      key = jax.random.fold_in(base_key, state["step"])
      aug_key, drop_key = jax.random.split(key)
      batch = train_augment(batch, aug_key)
      (loss, metrics), grads = gradients(state["params"], rest, batch, drop_key)
      updates, opt = tx.update(grads, state["opt"], state["params"])
      params = _clamp_logit_scale(optax.apply_updates(state["params"], updates))
      metrics = {f"train/{k}": v for k, v in metrics.items()}
      metrics.update(
        {
          "train/loss": loss,
          "train/grad_norm": optax.tree_utils.tree_norm(grads),
          "train/lr": schedule(state["step"]),
        }
      )
      return {"step": state["step"] + 1, "params": params, "opt": opt}, metrics

    return loss_fn, embed_fn, gradients, train_step

  loss_fn, embed_fn, gradients, train_step = make_train_step(
    graphdef, config.accum_steps
  )

  def eval_step(params, rest, batch):
    batch = eval_augment(batch, jax.random.key(0))
    out = task.eval_outputs(nnx.merge(graphdef, params, rest), batch)
    return {**out, **{k: batch[k] for k in EVAL_KEYS}}

  def text_step(params, rest, tokens):
    return nnx.merge(graphdef, params, rest).encode_text(tokens)

  def features_step(params, rest, batch):
    batch = eval_augment(batch, jax.random.key(0))
    features = nnx.merge(graphdef, params, rest).features(batch["video"])
    keys = EVAL_KEYS + ("label",)
    return {"features": features, **{k: batch[k] for k in keys}}

  def raw_batch_loss(params, rest, batch, key):
    aug_key, drop_key = jax.random.split(key)
    return loss_fn(params, rest, train_augment(batch, aug_key), drop_key)

  def raw_batch_gradients(params, rest, batch, key):
    aug_key, drop_key = jax.random.split(key)
    return gradients(params, rest, train_augment(batch, aug_key), drop_key)

  def raw_batch_embed(params, rest, batch, key):
    aug_key, drop_key = jax.random.split(key)
    return embed_fn(params, rest, train_augment(batch, aug_key), drop_key)

  state_shardings, rest_shardings = shardings
  batch, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)

  def jit_train(step):
    return jax.jit(
      step,
      donate_argnums=0,
      in_shardings=(state_shardings, rest_shardings, batch, replicated),
      out_shardings=(state_shardings, replicated),
    )

  start = unmask_start(config) if unmasked_graphdef is not None else None
  unmasked_train = None
  if start is not None:
    unmasked_train = jit_train(
      make_train_step(unmasked_graphdef, unmask_accum(config))[-1]
    )
  return Steps(
    loss=raw_batch_loss,
    gradients=raw_batch_gradients,
    embed=raw_batch_embed if isinstance(task, tasks.EmbeddingTask) else None,
    train=jit_train(train_step),
    unmasked_train=unmasked_train,
    unmask_start=start,
    eval=jax.jit(
      eval_step,
      in_shardings=(state_shardings["params"], rest_shardings, batch),
      out_shardings=batch,
    ),
    text=jax.jit(text_step),
    features=jax.jit(
      features_step,
      in_shardings=(state_shardings["params"], rest_shardings, batch),
      out_shardings=batch,
    )
    if config.model.get("probe")
    else None,
  )


def _unmasked_graphdef(model, seed: int):
  """The graph of the unmasked tuning's steps: the model of the spec whose
  video tower sees every token (`spec.unmasked`), built abstractly; the
  model's own graph where it never masks."""
  spec = spec_lib.unmasked(model.spec)
  if spec == model.spec:
    return nnx.graphdef(model)
  return nnx.graphdef(
    nnx.eval_shape(lambda: models.build_model(spec, rngs=nnx.Rngs(seed)))
  )


def _train_state(tx, params) -> dict:
  return {
    "step": jnp.zeros((), jnp.int32),
    "params": params,
    "opt": tx.init(params),
  }


def _optimizer(config):
  return optim.make_optimizer(
    config.optim, config.total_steps, tuning=unmask_tuning(config)
  )


def initial_state(config, state, rest, *, buffers_only: bool = False):
  """Runs the initializers, born on the shardings of an abstract state.

  Args:
    config: the run config (`model`, `optim`, `seed`).
    state, rest: from `build_state_and_steps(abstract=True)`.
    buffers_only: the model's untrained buffers only, for a state restored
      from a checkpoint (XLA drops the parameters' initializers).

  Returns:
    (state, rest) of arrays, or `rest` alone with `buffers_only`.
  """
  tx, _ = _optimizer(config)

  def init():
    model = models.build_model(config.model, rngs=nnx.Rngs(config.seed))
    _, params, buffers = nnx.split(model, nnx.Param, ...)
    return buffers if buffers_only else (_train_state(tx, params), buffers)

  target = rest if buffers_only else (state, rest)
  shardings = jax.tree.map(lambda x: x.sharding, target)
  return jax.jit(init, out_shardings=shardings)()


def build_state_and_steps(
  config,
  task: Task,
  mesh: jax.sharding.Mesh,
  *,
  abstract: bool = False,
  model=None,
) -> tuple[dict, Any, Steps]:
  """The train state (created sharded), model buffers and jitted steps.

  Args:
    config: the run config (`model`, `optim`, `total_steps`, `seed`, ...).
    task: the task module (`tasks.get_task(config.task)`).
    mesh: from `sharding.make_mesh`.
    abstract: return `jax.ShapeDtypeStruct`s (with shardings) instead of
      arrays: nothing is computed or allocated, and the steps can still be
      traced, lowered or compiled for them (`initial_state` computes them).
    model: with `abstract`, the model's abstract form (`nnx.eval_shape`
      of `models.build_model`, of `config.model` or a variant of its spec:
      `vidjax.memory` passes one per remat policy) to use instead of
      tracing its construction again.

  Returns:
    (state, rest, steps): state {step, params, opt}, the model's untrained
    buffers, and the `Steps`.
  """
  tx, schedule = _optimizer(config)
  # Tracing a model's construction (its initializers) takes seconds for a
  # ViT-B: done once here for the graph, shapes and shardings;
  # `initial_state` traces it once more to run it.
  if model is None:
    model = nnx.eval_shape(
      lambda: models.build_model(config.model, rngs=nnx.Rngs(config.seed))
    )
  elif not abstract:
    raise ValueError("a prebuilt abstract model needs abstract=True")
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  unmasked_graphdef = _unmasked_graphdef(model, config.seed)
  shapes = (jax.eval_shape(functools.partial(_train_state, tx), params), rest)
  shardings = sharding.param_shardings(shapes, mesh)
  state, rest = sharding.with_shardings(shapes, shardings)
  if not abstract:
    state, rest = initial_state(config, state, rest)
  steps = make_steps(
    config, task, graphdef, tx, schedule, mesh, shardings, unmasked_graphdef
  )
  return state, rest, steps
