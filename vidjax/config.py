"""Config helpers: load "file.py[:arg]" with overrides, validate, config.json.

Configs are Python files with `get_config(arg=None) -> ConfigDict` (big_vision
style): `configs/demo.py:debug` calls `get_config("debug")`. `main.py`
reads them through `config_flags.DEFINE_config_file`; `load_config` does the
same from a notebook or a test, overrides included.

Keys every config has (DESIGN §3): `seed`, `total_steps`,
`checkpoint.every_steps`, `log.every_steps`. `validate` also checks, when
present: `batch_size` (global, all processes) against the devices and
`accum_steps`, `eval.batch_size`, and `data.num_frames` against
`model.tubelet`.
"""

from __future__ import annotations

from collections.abc import Sequence
import difflib
import json
import os
import warnings

from absl import flags
import jax
import ml_collections
from ml_collections import config_flags

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


def _unknown_key_message(config, dotted: str) -> str | None:
  """Explains the first missing part of `dotted`; None if the path exists."""
  node, walked = config, []
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      return f"'{'.'.join(walked)}' is a {type(node).__name__}, not a config section"
    if part not in node:
      where = f"'{'.'.join(walked)}'" if walked else "the top level"
      keys = sorted(node.keys())
      close = difflib.get_close_matches(part, keys, n=3)
      hint = f"; did you mean {', '.join(close)}?" if close else ""
      return (f"unknown config key '{'.'.join(walked + [part])}': {where} has "
              f"{keys}{hint}")
    node = node[part]
    walked.append(part)
  return None


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads a config exactly as `--config=SPEC --config.KEY=VALUE ...` would.

  Args:
    spec: "path/to/config.py" or "path/to/config.py:arg" (passed to
      `get_config(arg)`).
    overrides: "key.sub=value" strings (a leading "--config." is allowed);
      values are parsed with the type of the existing field.

  Returns:
    The locked `ConfigDict`: assigning a new key raises.

  Raises:
    FileNotFoundError: the file does not exist.
    KeyError: an override names a key the config does not have.
    ValueError: an override's value does not parse as the field's type.
  """
  path = spec.split(":", 1)[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} (from {spec!r}) not found")
  overrides = [o.removeprefix("--").removeprefix("config.") for o in overrides]
  for o in overrides:
    if "=" not in o:
      raise ValueError(f"override {o!r} must look like key.sub=value")
  argv = ["load_config", f"--config={spec}"] + [f"--config.{o}" for o in overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=flag_values,
                                  sys_argv=argv, lock_config=True)
  try:
    with warnings.catch_warnings():  # ml_collections' loader, not ours
      warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)
      flag_values(argv)
  except (AttributeError, KeyError) as e:
    base = load_config(spec)  # to say which key is unknown
    for o in overrides:
      message = _unknown_key_message(base, o.split("=", 1)[0])
      if message:
        raise KeyError(f"{spec}: override {o!r}: {message}") from e
    raise
  except flags.Error as e:
    raise ValueError(f"{spec}: {e}") from e
  return flag_values.config


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Locks `config` in place (new keys raise; values may change); returns it."""
  config.lock()
  return config


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None):
  """Checks a config before any work starts; raises one error listing all.

  Args:
    config: the run's config.
    num_devices: devices the batch is split over (default: all of them).

  Raises:
    ValueError: naming each problem and what to change.
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
  if problems:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(problems))


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
