"""`validate`: a config's problems, all named at once, before any work starts.

Checked: keys missing from the base config, `seed`, `total_steps` (or
`total_epochs`), `batch_size` (global, all processes) against the devices and
`accum_steps`, `eval.batch_size`, the keys that must agree (the model's frames
and image size with the data's, `model.tubelet` and the patch size, the model
with the task), every key that names a choice (`vidjax.config.defaults.choices`:
task, annotation format, sampling, crop, the model's dtypes, attention, remat,
activation, the optimizer, its schedule, ...), the fractions, and the sizes
(integers within 32 bits, sizes at least 1, a clip's frames at most
`CLIP_BYTES_LIMIT`). (What needs the machine's GPU, cuDNN attention and
memory, `vidjax.memory` checks.)
"""

from __future__ import annotations

import difflib

import ml_collections

from vidjax.base import errors
from vidjax.config import defaults
from vidjax.config.keys import (
  ACCUM_KEY,
  BATCH_KEY,
  EVAL_BATCH_KEY,
  NUM_FRAMES_KEY,
  REPEATS_KEY,
  TUBELET_KEY,
  UNMASK_ACCUM_KEY,
  lookup,
)

REQUIRED_KEYS = (
  "seed",
  "total_steps",
  "checkpoint.every_steps",
  "log.every_steps",
)

# Sizes and counts that must be at least 1 (a 0 divides every batch and
# makes no clip, layer or step).
POSITIVE_KEYS = (
  BATCH_KEY,
  ACCUM_KEY,
  "data.num_frames",
  "data.size",
  "data.stride",
  "data.eval_clips",
  "data.eval_crops",
  "eval.batch_size",
  "model.width",
  "model.depth",
  "model.heads",
  "model.tubelet",
  "fsdp",
)
# Every integer setting but the seed: step counters, array sizes and data
# indices are 32-bit on the devices and in the data pipeline.
INT_LIMIT = 2**31 - 1
# One clip's uint8 frames, num_frames x size x size x 3 bytes (AVION's
# 16 x 224 x 224 clip is 2.4 MB): beyond this no batch of clips is trained.
CLIP_BYTES_LIMIT = 2**30


def _choice_problems(config) -> list[str]:
  """Names the unknown choices (task, format, model, optimizer, ...) and
  the fractions out of [0, 1]."""
  problems = []
  for key, allowed in defaults.choices(config).items():
    value = lookup(config, key, None)
    if value is not None and value not in allowed:
      close = difflib.get_close_matches(str(value), allowed, n=1)
      problems.append(
        f"'{key}' = {value!r} is not one of {list(allowed)}"
        + (f"; did you mean {close[0]!r}?" if close else "")
      )
  for key in (
    "data.max_skip_fraction",
    "data.max_bad_row_fraction",
    "unmask_fraction",
  ):
    value = lookup(config, key, None)
    if value is not None and not 0 <= value <= 1:
      problems.append(f"'{key}' = {value!r} must be a fraction in [0, 1]")
  mask = lookup(config, "model.mask_ratio", None)
  if mask is not None and not 0 <= mask < 1:  # 1 would leave no token.
    problems.append(f"'model.mask_ratio' = {mask!r} must be in [0, 1)")
  stall = lookup(config, "data.stall_warn_s", None)
  if stall is not None and not stall > 0:
    problems.append(f"'data.stall_warn_s' = {stall!r} must be > 0 seconds")
  return problems


def _size_problems(config) -> list[str]:
  """Sizes out of range: an integer past 32 bits, a size below 1, a clip
  too large to train on (named before anything is built or compiled)."""
  problems = []

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{prefix}{key}.")
      elif (
        isinstance(value, int)
        and not isinstance(value, bool)
        # The seed; a model key that is the data's is named there.
        and f"{prefix}{key}" not in ("seed", *defaults.REFERENCES)
        and abs(value) > INT_LIMIT
      ):
        problems.append(
          f"'{prefix}{key}' = {value} is out of range: integer settings "
          f"are at most {INT_LIMIT} (2**31 - 1)"
        )

  walk(config, "")
  for key in POSITIVE_KEYS:
    value = lookup(config, key, None)
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
      problems.append(f"'{key}' = {value} must be at least 1")
  frames, size = (
    lookup(config, NUM_FRAMES_KEY, None),
    lookup(config, "data.size", None),
  )
  if all(isinstance(v, int) and 0 < v <= INT_LIMIT for v in (frames, size)):
    clip = frames * size * size * 3
    if clip > CLIP_BYTES_LIMIT:
      problems.append(
        f"one clip of '{NUM_FRAMES_KEY}' = {frames} frames at 'data.size' = "
        f"{size} is {clip / 2**30:,.1f} GiB of frames ({frames} x {size} x "
        f"{size} x 3 bytes); a clip is at most {CLIP_BYTES_LIMIT // 2**30} GiB "
        "(AVION's clips: 16 frames of 224)"
      )
  return problems


def _disagreements(config) -> list[str]:
  """Keys whose values must fit each other but do not, naming both."""
  problems = []
  for key, ref in defaults.REFERENCES.items():
    value, expected = lookup(config, key, None), lookup(config, ref, None)
    if None not in (value, expected) and value != expected:
      problems.append(
        f"'{key}' = {value!r} but '{ref}' = {expected!r}: the "
        f"model's is the data's; set '{ref}' alone"
      )
  task, name = lookup(config, "task", None), lookup(config, "model.name", None)
  if name and defaults.TASK_MODELS.get(task, name) != name:
    problems.append(
      f"'model.name' = {name!r} but 'task' = {task!r} trains "
      f"a {defaults.TASK_MODELS[task]!r} model"
    )
  size, variant = (
    lookup(config, "data.size", None),
    lookup(config, "model.variant", None),
  )
  if isinstance(size, int) and variant:
    try:
      patch = defaults.parse_variant(variant)["patch_size"]
    except ValueError as e:
      problems.append(f"'model.variant': {e}")
    else:
      if size % patch:
        problems.append(
          f"'data.size' = {size} is not divisible by the patch "
          f"size {patch} of 'model.variant' = {variant!r}"
        )
  for set_name, spec in lookup(config, "eval.sets", {}).items():
    for key in ("num_frames", "size"):  # The model is built for the run's.
      value = lookup(spec, f"data.{key}", None)
      if value is not None and value != config.data[key]:
        problems.append(
          f"'eval.sets.{set_name}.data.{key}' = {value!r} but "
          f"'data.{key}' = {config.data[key]!r}: the model is "
          "the run's"
        )
  return problems


def _missing_keys(config) -> list[str]:
  """Keys of the base config (and of `eval_set`) that `config` lacks."""

  def missing(node, base, prefix):
    out = []
    for key in base:
      if key not in node:
        out.append(prefix + key)
      elif isinstance(base[key], ml_collections.ConfigDict) and isinstance(
        node[key], ml_collections.ConfigDict
      ):
        out += missing(node[key], base[key], f"{prefix}{key}.")
    return out

  task = lookup(config, "task", None)
  if task not in defaults.TASK_MODELS:
    return []  # Named by `_choice_problems`.
  keys = missing(config, defaults.base_config(task), "")
  for name, spec in lookup(config, "eval.sets", {}).items():
    keys += missing(spec, defaults.eval_set(""), f"eval.sets.{name}.")
  if not keys:
    return []
  more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
  return [
    f"missing keys: {', '.join(keys[:8])}{more}; build the config on "
    f"vidjax.config.defaults.base_config({task!r}) (eval.sets on "
    "vidjax.config.defaults.eval_set)"
  ]


def validate(config: ml_collections.ConfigDict, num_devices: int):
  """Checks a config before any work starts; raises one error listing all.

  Args:
    config: the run's config.
    num_devices: devices the batch is split over (`jax.device_count()`).

  Raises:
    errors.ConfigError: naming each problem and what to change.
  """
  problems = []
  by_epochs = lookup(config, "total_epochs", 0) > 0  # Sets total_steps.
  for key in REQUIRED_KEYS:
    value = lookup(config, key, None)
    if value is None:
      problems.append(f"'{key}' is missing: every config needs it")
    elif (
      key != "seed"
      and not (key == "total_steps" and by_epochs)
      and (not isinstance(value, int) or value <= 0)
    ):
      problems.append(f"'{key}' = {value!r} must be a positive integer")

  batch = lookup(config, BATCH_KEY, None)
  for accum_key in (ACCUM_KEY, UNMASK_ACCUM_KEY):
    accum = lookup(config, accum_key, 0) or 0
    if batch is None or (accum_key != ACCUM_KEY and not accum):
      continue
    accum = max(accum, 1)
    if accum < 0 or batch % accum:
      problems.append(
        f"'{BATCH_KEY}' = {batch} is not divisible by '{accum_key}' = {accum}"
      )
    elif (batch // accum) % num_devices:
      micro = batch // accum
      problems.append(
        f"'{BATCH_KEY}' = {batch}"
        + (f" / '{accum_key}' = {accum} = {micro}" if accum > 1 else "")
        + f" is not divisible by the {num_devices} devices; use a multiple of "
        f"{num_devices * accum}"
      )
  problems += _repeat_problems(config, batch, num_devices)
  eval_batch = lookup(config, EVAL_BATCH_KEY, None)
  if eval_batch is not None and eval_batch % num_devices:
    problems.append(
      f"'{EVAL_BATCH_KEY}' = {eval_batch} is not divisible by the "
      f"{num_devices} devices"
    )

  frames, tubelet = (
    lookup(config, NUM_FRAMES_KEY, None),
    lookup(config, TUBELET_KEY, None),
  )
  if frames is not None and tubelet and frames % tubelet:
    problems.append(
      f"'{NUM_FRAMES_KEY}' = {frames} is not divisible by "
      f"'{TUBELET_KEY}' = {tubelet}"
    )
  problems += _size_problems(config)
  problems += _choice_problems(config)
  problems += _disagreements(config)
  problems += _missing_keys(config)
  if defaults.needs_relevancy(config) and lookup(config, "data.format", "") != (
    "ek100_mir"
  ):
    problems.append(
      f"'loss.name' = {config.loss.name!r} reads the EK-100 MIR training "
      "relevancy of every in-batch pair: it needs 'data.format' = "
      "'ek100_mir' (or 'loss.name' = 'max_margin')"
    )
  if problems:
    raise errors.ConfigError(
      "invalid config:\n  - " + "\n  - ".join(problems),
      hint="change them with --config.KEY=VALUE",
    )


def _repeat_problems(config, batch: int | None, num_devices: int) -> list:
  """`data.repeats`: a positive integer dividing the batch into clips that
  split over the devices; not for video-text tasks."""
  repeats = lookup(config, REPEATS_KEY, 1)
  if repeats == 1:
    return []
  if not isinstance(repeats, int) or repeats < 1:
    return [f"'{REPEATS_KEY}' = {repeats!r} must be a positive integer"]
  task = lookup(config, "task", None)
  if defaults.needs_text(task):
    return [
      f"'{REPEATS_KEY}' = {repeats}: the {task} task cannot repeat clips "
      "(a clip's other views in the batch would be false negatives of its "
      "caption); use 1"
    ]
  if batch is None:
    return []
  if batch % repeats or (batch // repeats) % num_devices:
    return [
      f"'{BATCH_KEY}' = {batch} / '{REPEATS_KEY}' = {repeats} clips a step "
      f"do not split over the {num_devices} devices; use a multiple of "
      f"{repeats * num_devices}"
    ]
  return []
