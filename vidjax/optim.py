"""The optax optimizer and learning-rate schedule, built from a config.

`tx, schedule = make_optimizer(config, total_steps)` chains, in order:
  clip by global norm -> AdamW / SGD / Lion (with masked weight decay)
  -> layer-wise lr decay. (Gradient accumulation lives in the train step:
  `config.accum_steps`, see `vidjax.steps`.)

Config keys (`vidjax.config.defaults.optim_config()` has them all):
  name: 'adamw', 'sgd' (heavy-ball momentum, torch-style coupled weight
    decay) or 'lion'.
  lr: peak learning rate, reached after warmup.
  min_lr: final learning rate of the cosine schedule.
  warmup_steps: linear warmup from `warmup_lr` over this many optimizer steps.
  warmup_lr: where the warmup starts (0; AVION's and SMS's --lr-start 1e-6).
  schedule: 'cosine' (to min_lr at total_steps) or 'constant' (after warmup).
  weight_decay: decoupled for AdamW and Lion, added to the gradient for SGD.
    Never applied to params whose path matches `no_decay_names` or that have
    fewer than 2 dims (biases, norm scales, scalars), but for
    `DECAYED_VECTORS` (AVION decays them).
  no_decay_names: substrings of a param path that exclude it from decay.
  b1, b2: AdamW/Lion betas. eps: AdamW epsilon.
  momentum, nesterov: SGD momentum; nesterov also selects NAdamW for 'adamw'.
  clip_grad_norm: max global gradient norm; 0 disables clipping.
  layer_decay: layer-wise lr decay for fine-tuning; 1.0 disables. A param of
    layer id i gets lr * layer_decay ** (num_layers + 1 - i).
  num_layers: number of transformer blocks L; 0 infers it from the paths.
  layer_regex: regex whose group 1 is the block index in a param path.
  embed_regex: regex for embedding params (layer id 0).
  mu_dtype: dtype of first moments / momentum, e.g. 'bfloat16'; '' keeps the
    params' dtype.
  frozen: parameter path prefixes (e.g. 'encoder') never updated: no step,
    no weight decay, no optimizer state (a probe's frozen encoder).

Param paths are the pytree key path joined with '/', with the '.value' that
flax nnx Variables add dropped: 'blocks/3/attn/qkv/kernel'. Layer ids follow
BEiT/VideoMAE: embeddings (`embed_regex`) 0, block i (`layer_regex`, e.g.
'blocks/<i>/', 'layers_<i>/', 'resblocks.<i>.') i + 1, everything else
(final norm, head) L + 1, so the head keeps the full lr. Pass `layer_id_fn`
to `make_optimizer` for another convention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import re

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vidjax.base import keypaths
from vidjax.config import defaults

LayerIdFn = Callable[[str, int], int]
# Vectors here that the released layouts hold as [1, 1, D] (VideoMAE's
# mask_token): AVION's rule (2 dims or more) decays them, so ours does.
DECAYED_VECTORS = ("mask_token",)


def decay_mask(params, no_decay_names: Sequence[str]):
  """Pytree of bools like `params`: True where weight decay applies."""

  def decays(path, x):
    name = keypaths.name(path, "/")
    shaped = len(jnp.shape(x)) >= 2 or name.split("/")[-1] in DECAYED_VECTORS
    return shaped and not any(s in name for s in no_decay_names)

  return jax.tree_util.tree_map_with_path(decays, params)


def regex_layer_id(layer_regex: str, embed_regex: str) -> LayerIdFn:
  """A `layer_id_fn(path, num_layers)` from the two regexes of the config."""
  layer_re, embed_re = re.compile(layer_regex), re.compile(embed_regex)

  def layer_id(path: str, num_layers: int) -> int:
    match = layer_re.search(path)
    if match:
      return int(match.group(1)) + 1
    if embed_re.search(path):
      return 0
    return num_layers + 1

  return layer_id


def layer_scales(
  params,
  layer_decay: float,
  num_layers: int = 0,
  layer_id_fn: LayerIdFn | None = None,
  layer_regex: str | None = None,
):
  """Pytree of floats like `params`: the lr multiplier of each param.

  Args:
    params: any pytree (dict, nnx.State, ...) of arrays.
    layer_decay: decay factor d; scale = d ** (L + 1 - layer_id).
    num_layers: L; 0 infers it as 1 + the largest block index matched by
      `layer_regex` (defaults to the default config's).
    layer_id_fn: maps (path, L) to a layer id in [0, L + 1].
    layer_regex: used for inferring L (and by the default layer_id_fn).
  """
  default = defaults.optim_config()
  layer_regex = layer_regex or default.layer_regex
  layer_id_fn = layer_id_fn or regex_layer_id(layer_regex, default.embed_regex)
  paths = [
    keypaths.name(p, "/")
    for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]
  if num_layers <= 0:
    blocks = [
      int(m.group(1)) for m in map(re.compile(layer_regex).search, paths) if m
    ]
    if not blocks:
      raise ValueError(
        f"optim: layer_decay is set but no param path matches layer_regex "
        f"{layer_regex!r} (e.g. {paths[:3]}); set num_layers/layer_regex"
      )
    num_layers = max(blocks) + 1
  return jax.tree_util.tree_map_with_path(
    lambda p, _: float(
      layer_decay
      ** (num_layers + 1 - layer_id_fn(keypaths.name(p, "/"), num_layers))
    ),
    params,
  )


def scale_by_layer(
  layer_decay: float,
  num_layers: int,
  layer_id_fn: LayerIdFn | None,
  layer_regex: str,
) -> optax.GradientTransformation:
  """Multiplies each update by its `layer_scales` factor (constants at trace time)."""

  def update(updates, state, params=None):
    del params
    scales = layer_scales(
      updates, layer_decay, num_layers, layer_id_fn, layer_regex
    )
    return jax.tree.map(
      lambda u, s: u * jnp.asarray(s, u.dtype), updates, scales
    ), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@dataclasses.dataclass(frozen=True)
class Tuning:
  """A last phase with its own learning rate (FLIP's unmasked tuning): from
  optimizer step `start` on, a linear warmup from 0 to `lr` over
  `warmup_steps`, then the schedule's shape at that scale."""

  start: int
  lr: float
  warmup_steps: int = 0


def make_schedule(
  config: ml_collections.ConfigDict,
  total_steps: int,
  tuning: Tuning | None = None,
) -> optax.Schedule:
  """Learning rate per optimizer step: linear warmup from `warmup_lr` to `lr` over
  `warmup_steps`, then cosine to `min_lr` at `total_steps` (optax's
  `warmup_cosine_decay_schedule`) or constant. A warmup as long as the run
  ends at `lr`. With `tuning`, its steps follow their own (`Tuning`): a
  cosine ends at `min_lr` scaled as the tuning's lr is, at `total_steps`."""
  if config.schedule not in defaults.SCHEDULES:
    raise ValueError(
      f"optim: config.schedule must be one of {defaults.SCHEDULES}, "
      f"got {config.schedule!r}"
    )
  base = _schedule(
    config.schedule,
    float(config.lr),
    float(config.min_lr),
    int(config.warmup_steps),
    total_steps,
    float(config.get("warmup_lr", 0.0)),
  )
  if tuning is None:
    return base
  scale = tuning.lr / float(config.lr) if config.lr else 0.0
  tune = _schedule(
    config.schedule,
    float(tuning.lr),
    float(config.min_lr) * scale,
    int(tuning.warmup_steps),
    total_steps - tuning.start,
  )
  return optax.join_schedules([base, tune], [tuning.start])


def _schedule(kind, lr, min_lr, warmup, total_steps, init=0.0):
  if kind == "cosine" and warmup < total_steps:
    return optax.warmup_cosine_decay_schedule(
      init, lr, warmup, total_steps, min_lr
    )
  # Constant after the warmup: the step program does not depend on total_steps.
  return (
    optax.linear_schedule(init, lr, warmup)
    if warmup
    else optax.constant_schedule(lr)
  )


def make_optimizer(
  config: ml_collections.ConfigDict,
  total_steps: int,
  *,
  layer_id_fn: LayerIdFn | None = None,
  tuning: Tuning | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Builds the optimizer described in the module docstring.

  Args:
    config: optimizer config (`config.optim`).
    total_steps: number of optimizer updates of the run (for the schedule).
    layer_id_fn: overrides the regex layer ids for layer decay.
    tuning: a last phase with its own learning rate (`make_schedule`).

  Returns:
    (tx, schedule): the optax GradientTransformation (call
    `tx.update(grads, state, params)`; params are needed for weight decay)
    and its base learning rate per optimizer step, for logging.
  """
  if total_steps <= 0:
    raise ValueError(f"optim: total_steps must be positive, got {total_steps}")
  schedule = make_schedule(config, total_steps, tuning)
  mu_dtype = jnp.dtype(config.mu_dtype) if config.mu_dtype else None
  wd = float(config.weight_decay)
  mask = lambda params: decay_mask(params, tuple(config.no_decay_names))  # noqa: E731

  name = config.name
  if name == "adamw":
    opt = optax.adamw(
      schedule,
      b1=config.b1,
      b2=config.b2,
      eps=config.eps,
      mu_dtype=mu_dtype,
      weight_decay=wd,
      mask=mask,
      nesterov=bool(config.nesterov),
    )
  elif name == "lion":
    opt = optax.lion(
      schedule,
      b1=config.b1,
      b2=config.b2,
      mu_dtype=mu_dtype,
      weight_decay=wd,
      mask=mask,
    )
  elif name == "sgd":
    opt = optax.sgd(
      schedule,
      momentum=config.momentum or None,
      nesterov=bool(config.nesterov),
      accumulator_dtype=mu_dtype,
    )
    if (
      wd
    ):  # torch.optim.SGD's weight decay: added to the gradient before momentum.
      opt = optax.chain(optax.add_decayed_weights(wd, mask), opt)
  else:
    raise ValueError(
      f"optim: config.name must be one of {defaults.OPTIMIZERS}, got {name!r}"
    )

  parts = []
  if config.clip_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(float(config.clip_grad_norm)))
  parts.append(opt)
  if config.layer_decay != 1.0:
    parts.append(
      scale_by_layer(
        float(config.layer_decay),
        int(config.num_layers),
        layer_id_fn or regex_layer_id(config.layer_regex, config.embed_regex),
        config.layer_regex,
      )
    )
  tx = optax.chain(*parts)
  if config.get("frozen"):
    tx = optax.multi_transform(
      {"train": tx, "frozen": optax.set_to_zero()},
      lambda params: frozen_labels(params, tuple(config.frozen)),
    )
  return tx, schedule


def frozen_labels(params, prefixes: Sequence[str]):
  """Pytree of 'frozen' (path under one of `prefixes`) or 'train'."""

  def label(path, x):
    del x
    name = keypaths.name(path, "/")
    under = any(
      name == p or name.startswith(p.rstrip("/") + "/") for p in prefixes
    )
    return "frozen" if under else "train"

  return jax.tree_util.tree_map_with_path(label, params)
