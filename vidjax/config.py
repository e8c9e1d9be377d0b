"""Config helpers: load "file.py[:arg]" with overrides, validate, config.json.

Configs are Python files with `get_config(arg=None) -> ConfigDict` (big_vision
style): `configs/demo.py:debug` calls `get_config("debug")`. `load_config`
loads one with `--config.KEY=VALUE` overrides, for `main.py`, notebooks and
tests alike; mistakes raise `vidjax.errors.ConfigError`s that name the key
(with the known ones and close matches) or the value.

Keys every config has: `seed`, `total_steps`, `checkpoint.every_steps`,
`log.every_steps`. `validate` also checks, when present: `batch_size`
(global, all processes) against the devices and `accum_steps`,
`eval.batch_size`, `data.num_frames` against `model.tubelet`, the names of
the task, annotation format, sampling and crop, and the fractions.
"""

from __future__ import annotations

from collections.abc import Sequence
import difflib
import importlib.util
import json
import os
import re

from absl import flags
import jax
import ml_collections
from ml_collections import config_flags

from vidjax import errors

CONFIG_JSON = "config.json"
REQUIRED_KEYS = ("seed", "total_steps", "checkpoint.every_steps", "log.every_steps")
BATCH_KEY = "batch_size"
ACCUM_KEY = "accum_steps"
EVAL_BATCH_KEY = "eval.batch_size"
NUM_FRAMES_KEY = "data.num_frames"
TUBELET_KEY = "model.tubelet"

_MISSING = object()


def _get(config, dotted: str, default=_MISSING):
  """Value at a dotted path, or `default` if any part is missing."""
  node = config
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
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
      return (f"'{'.'.join(walked)}' is a {type(node).__name__}, not a config "
              f"section, so '{dotted}' does not exist", "")
    if part not in node:
      prefix = "".join(f"{w}." for w in walked)
      keys = sorted(node.keys())
      close = [prefix + k for k in difflib.get_close_matches(part, keys, n=3)]
      where = f"'{prefix[:-1]}'" if walked else "the top level"
      hint = f"did you mean {' or '.join(close)}? " if close else ""
      return (f"unknown config key '{prefix}{part}'",
              f"{hint}{where} has: {', '.join(keys)}")
    node = node[part]
    walked.append(part)
  return None


def _load_module(path: str, spec: str):
  """Imports the config file `path` as a fresh module."""
  name = "vidjax_config_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None:
    raise errors.ConfigError(f"{spec}: not a Python file",
                             hint="configs are .py files with get_config()")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise errors.ConfigError(f"{path} has no get_config() function")
  return module


def _override_args(overrides: Sequence[str]) -> list[str]:
  """'a.b=v', '--config.a.b=v', '--noconfig.flag' -> ml_collections flags."""
  args = []
  for o in overrides:
    o = o.removeprefix("--")
    no = "no" if o.startswith("noconfig.") else ""
    args.append(f"--{no}config.{o.removeprefix('noconfig.').removeprefix('config.')}")
  return args


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads a config exactly as `--config=SPEC --config.KEY=VALUE ...` would.

  Args:
    spec: "path/to/config.py" or "path/to/config.py:arg" (passed to
      `get_config(arg)`).
    overrides: "key.sub=value" strings (a leading "--config." is allowed;
      "--noconfig.key" sets a boolean to False); values are parsed with the
      type of the existing field.

  Returns:
    The locked `ConfigDict`: assigning a new key raises.

  Raises:
    errors.PathError: the file does not exist (a FileNotFoundError).
    errors.UnknownKeyError: an override names a key the config does not
      have (a KeyError; the message lists the known keys and close matches).
    errors.ConfigError: `get_config` refused `arg`, or an override's value
      does not parse as the field's type (a ValueError).
  """
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise errors.PathError(f"config file {path!r} not found",
                           hint="the shipped configs are in configs/*.py")
  module = _load_module(path, spec)
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except ValueError as e:  # The config's own message, e.g. an unknown variant.
    raise errors.ConfigError(str(e) if path in str(e) else f"{spec}: {e}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    config = ml_collections.ConfigDict(config)
  args = _override_args(overrides)
  argv = ["load_config"] + args
  flag_values = flags.FlagValues()
  try:
    config_flags.DEFINE_config_dict("config", config, flag_values=flag_values,
                                    sys_argv=argv, lock_config=True)
    flag_values(argv)
  except (AttributeError, KeyError):
    for a in args:
      key = a.split("=", 1)[0].removeprefix("--no").removeprefix("--config.")
      unknown = _unknown_key(config, key)
      if unknown:
        raise errors.UnknownKeyError(f"{unknown[0]} ({a}, {spec})",
                                     hint=unknown[1]) from None
    raise
  except (flags.Error, TypeError, ValueError) as e:
    raise errors.ConfigError(f"{spec}: {str(e).removeprefix('flag ')}") from None
  return flag_values.config


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Locks `config` in place (new keys raise; values may change); returns it."""
  config.lock()
  return config


def _choice_problems(config) -> list[str]:
  """Names the task / format / sampling / crop / fractions that are unknown."""
  # Imported here: the config module stays light for `load_config`.
  from vidjax import tasks  # pylint: disable=import-outside-toplevel
  from vidjax.data import annotations  # pylint: disable=import-outside-toplevel
  choices = {"task": tasks.TASKS, "data.format": tuple(annotations.LOADERS),
             "data.sampling": ("segment", "stride"),
             "data.crop": ("random_resized", "multi_scale", "center")}
  problems = []
  for key, allowed in choices.items():
    value = _get(config, key, None)
    if value is not None and value not in allowed:
      close = difflib.get_close_matches(str(value), allowed, n=1)
      problems.append(f"'{key}' = {value!r} is not one of {list(allowed)}"
                      + (f"; did you mean {close[0]!r}?" if close else ""))
  for key in ("data.max_skip_fraction", "data.max_bad_row_fraction"):
    value = _get(config, key, None)
    if value is not None and not 0 <= value <= 1:
      problems.append(f"'{key}' = {value!r} must be a fraction in [0, 1]")
  return problems


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None):
  """Checks a config before any work starts; raises one error listing all.

  Args:
    config: the run's config.
    num_devices: devices the batch is split over (default: all of them).

  Raises:
    errors.ConfigError: naming each problem and what to change.
  """
  num_devices = num_devices or jax.device_count()
  problems = []
  for key in REQUIRED_KEYS:
    value = _get(config, key, None)
    if value is None:
      problems.append(f"'{key}' is missing: every config needs it")
    elif key != "seed" and (not isinstance(value, int) or value <= 0):
      problems.append(f"'{key}' = {value!r} must be a positive integer")

  accum = _get(config, ACCUM_KEY, 1) or 1
  batch = _get(config, BATCH_KEY, None)
  if batch is not None:
    if batch % accum:
      problems.append(
          f"'{BATCH_KEY}' = {batch} is not divisible by '{ACCUM_KEY}' = {accum}")
    elif (batch // accum) % num_devices:
      micro = batch // accum
      problems.append(
          f"'{BATCH_KEY}' = {batch}" + (f" / '{ACCUM_KEY}' = {accum} = {micro}"
                                         if accum > 1 else "") +
          f" is not divisible by the {num_devices} devices; use a multiple of "
          f"{num_devices * accum}")
  eval_batch = _get(config, EVAL_BATCH_KEY, None)
  if eval_batch is not None and eval_batch % num_devices:
    problems.append(f"'{EVAL_BATCH_KEY}' = {eval_batch} is not divisible by the "
                    f"{num_devices} devices")

  frames, tubelet = _get(config, NUM_FRAMES_KEY, None), _get(config, TUBELET_KEY, None)
  if frames is not None and tubelet and frames % tubelet:
    problems.append(f"'{NUM_FRAMES_KEY}' = {frames} is not divisible by "
                    f"'{TUBELET_KEY}' = {tubelet}")
  problems += _choice_problems(config)
  if problems:
    raise errors.ConfigError("invalid config:\n  - " + "\n  - ".join(problems),
                             hint="change them with --config.KEY=VALUE")


def changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
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
        list(b) if isinstance(b, (list, tuple)) else b):
      out.append((f"{prefix}{key}", a, b))
  return out


def save_config_json(config: ml_collections.ConfigDict, workdir) -> str | None:
  """Writes WORKDIR/config.json (process 0 only); returns its path.

  Values JSON cannot hold (functions, classes) are written as strings.
  """
  if jax.process_index() != 0:
    return None
  os.makedirs(os.fspath(workdir), exist_ok=True)
  path = os.path.join(os.fspath(workdir), CONFIG_JSON)
  text = config.to_json_best_effort(indent=2, sort_keys=True)
  json.loads(text)  # fail here, not in a reader, if it is not valid JSON
  with open(path, "w", encoding="utf-8") as f:
    f.write(text + "\n")
  return path


def debug_on_synthetic(config: ml_collections.ConfigDict, **data) -> None:
  """Turns a recipe into its `:debug` variant: 2 steps on CPU, synthetic data.

  The part every recipe's `:debug` shares: a small synthetic corpus written
  into the workdir, 4 frames of 64 px read by 2 threads, batch 16, a
  checkpoint at step 2, metrics every step, one final eval. `data` adds or
  overrides `config.data` keys (e.g. format="jsonl", stride=4). The recipe
  then shrinks its model itself.
  """
  config.total_steps = 2
  config.batch_size = 16
  config.data.update(dict(num_frames=4, size=64, workers=0, threads=2, **data))
  config.data.synthetic = ml_collections.ConfigDict(dict(
      enabled=True, num_videos=8, segments_per_video=2, segment_seconds=2.0,
      height=96, width=128, seed=0))
  config.eval.update(every_steps=0, batch_size=8)
  config.checkpoint.every_steps = 2
  config.log.every_steps = 1
