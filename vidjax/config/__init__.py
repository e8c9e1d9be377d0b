"""Configs: load "file.py[:arg]" with overrides, validate, compare, paths.

Configs are Python files with `get_config(arg=None) -> ConfigDict` (big_vision
style) built on `vidjax.config.defaults.base_config`: `configs/demo.py:debug` calls
`get_config("debug")`. `load_config` loads one with `--config.KEY=VALUE`
overrides, for `main.py`, notebooks and tests alike; mistakes raise
`vidjax.base.errors.ConfigError`s that name the key (with the known ones and close
matches) or the value.

`validate` checks a config before any work starts: keys missing from the
base config, `seed`, `total_steps` (or `total_epochs`), `batch_size` (global,
all processes) against the devices and `accum_steps`, `eval.batch_size`, the
keys that must agree (the model's frames and image size with the data's,
`model.tubelet` and the patch size, the model with the task), every key
that names a choice (`vidjax.config.defaults.choices`: task, annotation format,
sampling, crop, the model's dtypes, attention, remat, activation, the
optimizer, its schedule, ...), the fractions, and the sizes (integers within
32 bits, sizes at least 1, a clip's frames at most `CLIP_BYTES_LIMIT`). (What needs the machine's
GPU, cuDNN attention and memory, `vidjax.memory` checks.)
`epochs_to_steps` turns the `*_epochs` keys into steps at start-up.

Like `vidjax.config.defaults`, this module imports no runtime (no jax, flax, grain,
orbax or PyAV): loading a recipe stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
import contextlib
import difflib
import importlib.util
import os
import re
import traceback

from absl import flags, logging
import ml_collections
from ml_collections import config_flags

from vidjax.base import errors, internals
from vidjax.config import defaults

REQUIRED_KEYS = (
  "seed",
  "total_steps",
  "checkpoint.every_steps",
  "log.every_steps",
)
BATCH_KEY = "batch_size"
ACCUM_KEY = "accum_steps"
UNMASK_ACCUM_KEY = "unmask_accum_steps"
EVAL_BATCH_KEY = "eval.batch_size"
NUM_FRAMES_KEY = "data.num_frames"
REPEATS_KEY = "data.repeats"
OVERRIDES_KEY = "overrides"  # The keys given on the command line.
TUBELET_KEY = "model.tubelet"
# `*_epochs` keys (> 0) and the step keys they set from the training records.
EPOCH_KEYS = {
  "total_epochs": "total_steps",
  "eval.every_epochs": "eval.every_steps",
  "checkpoint.every_epochs": "checkpoint.every_steps",
}

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

_MISSING = object()


def _get(config, dotted: str, default=_MISSING):
  """Value at a dotted path, or `default` if any part is missing."""
  node = config
  for part in dotted.split("."):
    if (
      not isinstance(node, (ml_collections.ConfigDict, dict))
      or part not in node
    ):
      if default is _MISSING:
        raise KeyError(dotted)
      return default
    node = node[part]
  return node


def _unknown_key(config, dotted: str) -> tuple[str, str] | None:
  """(message, hint) for the first missing part of `dotted`; None if it exists."""
  node, walked = config, []
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      return (
        f"'{'.'.join(walked)}' is a {type(node).__name__}, not a config "
        f"section, so '{dotted}' does not exist",
        "",
      )
    if part not in node:
      prefix = "".join(f"{w}." for w in walked)
      keys = sorted(node.keys())
      close = [prefix + k for k in difflib.get_close_matches(part, keys, n=3)]
      where = f"'{prefix[:-1]}'" if walked else "the top level"
      hint = f"did you mean {' or '.join(close)}? " if close else ""
      return (
        f"unknown config key '{prefix}{part}'",
        f"{hint}{where} has: {', '.join(keys)}",
      )
    node = node[part]
    walked.append(part)
  return None


def _parse_bool(value: str) -> bool:
  if value.lower() not in ("true", "false", "t", "f", "1", "0"):
    raise ValueError(value)
  return value.lower() in ("true", "t", "1")


def _parse_numbers(value: str) -> list[float]:
  return [float(v) for v in value.strip("()[] ").split(",") if v.strip()]


def _expected(current):
  """(the type in words, an example, a parser raising ValueError) for a
  key's current value; None when any string will do."""
  if isinstance(current, bool):
    return "true or false", "true", _parse_bool
  if isinstance(current, int):
    return "an integer", str(current), int
  if isinstance(current, float):
    return "a number", f"{current:g}", float
  if (
    isinstance(current, tuple)
    and current
    and all(isinstance(v, (int, float)) for v in current)
  ):
    return (
      "numbers separated by commas",
      ",".join(map(str, current)),
      _parse_numbers,
    )
  return None


def _wrong_type(config, args: Sequence[str]) -> str | None:
  """'--config.batch_size=eight: batch_size takes an integer, e.g.
  --config.batch_size=64' for the first override its key's type refuses."""
  for arg in args:
    key, equals, value = arg.removeprefix("--config.").partition("=")
    expected = _expected(_get(config, key, None)) if equals else None
    if expected:
      words, example, parse = expected
      try:
        parse(value)
      except ValueError:
        return f"{arg}: {key} takes {words}, e.g. --config.{key}={example}"
  return None


@contextlib.contextmanager
def _user_code(path: str, spec: str):
  """What the user's config file raises: a ConfigError at its line."""
  try:
    yield
  except errors.UserError:
    raise
  except ValueError as e:  # The config's own message, e.g. an unknown variant.
    raise errors.ConfigError(
      str(e) if path in str(e) else f"{spec}: {e}"
    ) from e
  except SyntaxError as e:
    raise errors.ConfigError(f"{e.filename}:{e.lineno}: {e.msg}") from e
  except Exception as e:  # Any, in user code.
    lines = [
      f.lineno
      for f in traceback.extract_tb(e.__traceback__)
      if os.path.abspath(f.filename) == os.path.abspath(path)
    ]
    where = f"{path}:{lines[-1]}" if lines else spec
    raise errors.ConfigError(f"{where}: {type(e).__name__}: {e}") from e


def _load_module(path: str, spec: str):
  """Imports the config file `path` as a fresh module."""
  name = "vidjax_config_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None:
    raise errors.ConfigError(
      f"{spec}: not a Python file",
      hint="configs are .py files with get_config()",
    )
  module = importlib.util.module_from_spec(module_spec)
  with _user_code(path, spec):
    module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise errors.ConfigError(f"{path} has no get_config() function")
  return module


def cpu_variant(spec: str) -> str | None:
  """The recipe's variant made for a CPU: `spec` with `cpu` added to its
  `:arg` (configs/own_videos.py) or else `debug`, the first its get_config
  takes; None if it takes neither or `spec` names one already."""
  path, _, arg = spec.partition(":")
  named = [v.strip() for v in arg.split(",") if v.strip()]
  if {"cpu", "debug"} & set(named):
    return None
  module = _load_module(path, spec)
  for extra in ("cpu", "debug"):
    candidate = ",".join(named + [extra])
    try:
      module.get_config(candidate)
    except Exception:
      continue  # Not one of its variants.
    return f"{path}:{candidate}"
  return None


def split_overrides(args: list[str]) -> tuple[list[str], list[str]]:
  """(`--config.KEY[=VALUE]` overrides, the other arguments).

  `--config.KEY VALUE` (a space instead of '=') is joined into one.
  """
  overrides, rest, i = [], [], 0
  while i < len(args):
    arg = args[i]
    if arg.startswith(("--config.", "--noconfig.")):
      if (
        "=" not in arg
        and i + 1 < len(args)
        and not args[i + 1].startswith("--")
      ):
        arg, i = f"{arg}={args[i + 1]}", i + 1
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return overrides, rest


def _override_args(overrides: Sequence[str]) -> list[str]:
  """'a.b=v', '--config.a.b=v', '--noconfig.flag' -> ml_collections flags."""
  args = []
  for o in overrides:
    o = o.removeprefix("--")
    no = "no" if o.startswith("noconfig.") else ""
    args.append(
      f"--{no}config.{o.removeprefix('noconfig.').removeprefix('config.')}"
    )
  return args


def load_config(
  spec: str, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
  """Loads a config exactly as `--config=SPEC --config.KEY=VALUE ...` would.

  Args:
    spec: "path/to/config.py" or "path/to/config.py:arg" (passed to
      `get_config(arg)`).
    overrides: "key.sub=value" strings (a leading "--config." is allowed;
      "--noconfig.key" sets a boolean to False); values are parsed with the
      type of the existing field.

  Returns:
    The locked `ConfigDict`: assigning a new key raises. Its `overrides`
    (where the config has that key) lists the keys the overrides set.

  Raises:
    errors.PathError: the file does not exist (a FileNotFoundError).
    errors.UnknownKeyError: an override names a key the config does not
      have (a KeyError; the message lists the known keys and close matches).
    errors.ConfigError: the file or its `get_config` raised (e.g. refused
      `arg`; named with the line), or an override's value does not parse
      as the field's type (a ValueError).
  """
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise errors.PathError(
      f"config file {path!r} not found",
      hint="the shipped configs are in configs/*.py",
    )
  module = _load_module(path, spec)
  with _user_code(path, spec):
    config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ml_collections.ConfigDict):
    config = ml_collections.ConfigDict(config)
  args = _override_args(overrides)
  wrong = _wrong_type(config, args)
  if wrong:  # Said in the key's terms, not the parser's.
    raise errors.ConfigError(f"{spec}: {wrong}")
  argv = ["load_config"] + args
  flag_values = flags.FlagValues()
  try:
    config_flags.DEFINE_config_dict(
      "config", config, flag_values=flag_values, sys_argv=argv, lock_config=True
    )
    flag_values(argv)
  except (AttributeError, KeyError):
    for a in args:
      key = a.split("=", 1)[0].removeprefix("--no").removeprefix("--config.")
      unknown = _unknown_key(config, key)
      if unknown:
        raise errors.UnknownKeyError(
          f"{unknown[0]} ({a}, {spec})", hint=unknown[1]
        ) from None
    raise
  except (flags.Error, TypeError, ValueError) as e:
    raise errors.ConfigError(
      f"{spec}: {internals.absl_flag_error(e)}"
    ) from None
  config = flag_values.config
  if OVERRIDES_KEY in config:  # Whose values they are: see models/facts.py.
    config[OVERRIDES_KEY] = tuple(
      a.split("=", 1)[0]
      .removeprefix("--")
      .removeprefix("no")
      .removeprefix("config.")
      for a in args
    )
  return config


def _choice_problems(config) -> list[str]:
  """Names the unknown choices (task, format, model, optimizer, ...) and
  the fractions out of [0, 1]."""
  problems = []
  for key, allowed in defaults.choices(config).items():
    value = _get(config, key, None)
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
    value = _get(config, key, None)
    if value is not None and not 0 <= value <= 1:
      problems.append(f"'{key}' = {value!r} must be a fraction in [0, 1]")
  mask = _get(config, "model.mask_ratio", None)
  if mask is not None and not 0 <= mask < 1:  # 1 would leave no token.
    problems.append(f"'model.mask_ratio' = {mask!r} must be in [0, 1)")
  stall = _get(config, "data.stall_warn_s", None)
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
    value = _get(config, key, None)
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
      problems.append(f"'{key}' = {value} must be at least 1")
  frames, size = (
    _get(config, NUM_FRAMES_KEY, None),
    _get(config, "data.size", None),
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
    value, expected = _get(config, key, None), _get(config, ref, None)
    if None not in (value, expected) and value != expected:
      problems.append(
        f"'{key}' = {value!r} but '{ref}' = {expected!r}: the "
        f"model's is the data's; set '{ref}' alone"
      )
  task, name = _get(config, "task", None), _get(config, "model.name", None)
  if name and defaults.TASK_MODELS.get(task, name) != name:
    problems.append(
      f"'model.name' = {name!r} but 'task' = {task!r} trains "
      f"a {defaults.TASK_MODELS[task]!r} model"
    )
  size, variant = (
    _get(config, "data.size", None),
    _get(config, "model.variant", None),
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
  for set_name, spec in _get(config, "eval.sets", {}).items():
    for key in ("num_frames", "size"):  # The model is built for the run's.
      value = _get(spec, f"data.{key}", None)
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

  task = _get(config, "task", None)
  if task not in defaults.TASK_MODELS:
    return []  # Named by `_choice_problems`.
  keys = missing(config, defaults.base_config(task), "")
  for name, spec in _get(config, "eval.sets", {}).items():
    keys += missing(spec, defaults.eval_set(""), f"eval.sets.{name}.")
  if not keys:
    return []
  more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
  return [
    f"missing keys: {', '.join(keys[:8])}{more}; build the config on "
    f"vidjax.config.defaults.base_config({task!r}) (eval.sets on "
    "vidjax.config.defaults.eval_set)"
  ]


def epochs_to_steps(
  config: ml_collections.ConfigDict, train_clips: int
) -> None:
  """Sets each step key of `EPOCH_KEYS` whose `*_epochs` key is > 0.

  An epoch is `train_clips // batch_size` steps (the last partial batch is
  dropped, as AVION does); each key gets at least one step. It counts the
  views trained on: with `data.repeats` R > 1 (`batch_size` views of
  batch_size / R clips a step) an epoch decodes each clip 1 / R times on
  average, and a config's epochs mean the same training whatever R (MAE-ST's
  "effective epochs").

  Args:
    config: the run's config (changed in place).
    train_clips: the training records kept at start-up.
  """
  repeats = _get(config, REPEATS_KEY, 1)
  steps_per_epoch = max(1, train_clips // config.batch_size)
  for epochs_key, steps_key in EPOCH_KEYS.items():
    epochs = _get(config, epochs_key, 0)
    if epochs > 0:
      section, _, name = steps_key.rpartition(".")
      node = _get(config, section) if section else config
      node[name] = max(1, round(epochs * steps_per_epoch))
      logging.info(
        "%s = %d: %s = %g epochs of %d steps%s",
        steps_key,
        node[name],
        epochs_key,
        epochs,
        steps_per_epoch,
        f" (epochs of {train_clips} views: {repeats} views per decoded clip, "
        f"each clip decoded every {repeats} epochs)"
        if repeats > 1
        else "",
      )


def validate(config: ml_collections.ConfigDict, num_devices: int):
  """Checks a config before any work starts; raises one error listing all.

  Args:
    config: the run's config.
    num_devices: devices the batch is split over (`jax.device_count()`).

  Raises:
    errors.ConfigError: naming each problem and what to change.
  """
  problems = []
  by_epochs = _get(config, "total_epochs", 0) > 0  # Sets total_steps.
  for key in REQUIRED_KEYS:
    value = _get(config, key, None)
    if value is None:
      problems.append(f"'{key}' is missing: every config needs it")
    elif (
      key != "seed"
      and not (key == "total_steps" and by_epochs)
      and (not isinstance(value, int) or value <= 0)
    ):
      problems.append(f"'{key}' = {value!r} must be a positive integer")

  batch = _get(config, BATCH_KEY, None)
  for accum_key in (ACCUM_KEY, UNMASK_ACCUM_KEY):
    accum = _get(config, accum_key, 0) or 0
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
  eval_batch = _get(config, EVAL_BATCH_KEY, None)
  if eval_batch is not None and eval_batch % num_devices:
    problems.append(
      f"'{EVAL_BATCH_KEY}' = {eval_batch} is not divisible by the "
      f"{num_devices} devices"
    )

  frames, tubelet = (
    _get(config, NUM_FRAMES_KEY, None),
    _get(config, TUBELET_KEY, None),
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
  if defaults.needs_relevancy(config) and _get(config, "data.format", "") != (
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
  repeats = _get(config, REPEATS_KEY, 1)
  if repeats == 1:
    return []
  if not isinstance(repeats, int) or repeats < 1:
    return [f"'{REPEATS_KEY}' = {repeats!r} must be a positive integer"]
  task = _get(config, "task", None)
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


def changes(
  old: dict, new: dict, prefix: str = ""
) -> list[tuple[str, object, object]]:
  """(dotted key, old value, new value) for each key that differs between two
  config dicts; a key only in one has None in the other.

  Tuples and lists compare equal when their items do (JSON turns one into
  the other).
  """
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += changes(a, b, f"{prefix}{key}.")
    elif (list(a) if isinstance(a, (list, tuple)) else a) != (
      list(b) if isinstance(b, (list, tuple)) else b
    ):
      out.append((f"{prefix}{key}", a, b))
  return out


# Keys that name files or directories, made absolute at start-up so that
# nothing depends on the directory the command started in. The `data` and
# `eval` ones, which each of `eval.sets` has too, may join several paths
# with commas.
PATH_KEYS = {
  "": ("resume", "init_from"),
  "data": (
    "root",
    "train_annotations",
    "eval_annotations",
    "vocab",
    "classes",
    "train_sentences",
    "train_relevancy",
  ),
  "eval": ("relevancy", "sentences"),
}


def _absolute(value: str, several: bool) -> str:
  """'a.jsonl,~/b.jsonl' -> '/cwd/a.jsonl,/home/me/b.jsonl' (`several`);
  URLs and '' are kept."""
  if not isinstance(value, str) or not value.strip() or "://" in value:
    return value
  paths = [p.strip() for p in value.split(",")] if several else [value]
  return ",".join(os.path.abspath(os.path.expanduser(p)) for p in paths if p)


def make_paths_absolute(config: ml_collections.ConfigDict) -> None:
  """Makes the paths of `PATH_KEYS` absolute, in place."""
  sections = [
    (config, PATH_KEYS[""], False),
    (_get(config, "data", {}), PATH_KEYS["data"], True),
    (_get(config, "eval", {}), PATH_KEYS["eval"], True),
    # A distilled student's teacher, named so in its checkpoints.
    (_get(config, "model.teacher", {}), ("source",), False),
  ]
  for spec in _get(config, "eval.sets", {}).values():  # Its `eval` keys are
    sections += [
      (_get(spec, "data", {}), PATH_KEYS["data"], True),  # its own.
      (spec, PATH_KEYS["eval"], True),
    ]
  for node, keys, several in sections:
    for key in keys:
      if key in node and node[key]:
        node[key] = _absolute(node[key], several)


class LockedConfig(ml_collections.FrozenConfigDict):
  """A run's config once start-up has settled it: any write raises.

  `to_dict` gives lists as lists (the JSON of config.json and of a
  checkpoint's config, as before the lock); `copy_and_resolve_references`
  (and `copy`, for its sections too) a changeable copy, for a variant.
  """

  def to_dict(self, *args, **kwargs) -> dict:
    return self.as_configdict().to_dict(*args, **kwargs)

  def copy_and_resolve_references(self, visit_map=None):
    del visit_map  # (`as_configdict` is shared: copied, to be changed.)
    return self.as_configdict().copy_and_resolve_references()


def lock(config: ml_collections.ConfigDict) -> LockedConfig:
  """`config` as a `LockedConfig` (references resolved): what a run reads
  after its start-up; writing one of its keys raises AttributeError."""
  return LockedConfig(config)


def copy(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A changeable copy of a config, locked (`lock`) or not, its references
  resolved: for variants (a remat policy, an evaluation set's keys)."""
  if isinstance(config, ml_collections.FrozenConfigDict):
    config = config.as_configdict()  # (Shared by every call: copied.)
  return config.copy_and_resolve_references()
