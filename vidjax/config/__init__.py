"""Configs: load "file.py[:arg]" with overrides, validate, compare, paths.

Configs are Python files with `get_config(arg=None) -> ConfigDict` (big_vision
style) built on `vidjax.config.defaults.base_config`: `configs/demo.py:debug` calls
`get_config("debug")`. `load_config` (`loading`) loads one with
`--config.KEY=VALUE` overrides, for `main.py`, notebooks and tests alike;
mistakes raise `vidjax.base.errors.ConfigError`s that name the key (with the
known ones and close matches) or the value.

`validate` (`checks`) checks a config before any work starts and names every
problem at once. `epochs_to_steps` turns the `*_epochs` keys into steps at
start-up; `make_paths_absolute`, `lock` and `copy` settle a run's config;
`changes` compares two.

Like `vidjax.config.defaults`, this package imports no runtime (no jax, flax,
grain, orbax or PyAV): loading a recipe stays light.
"""

from __future__ import annotations

import os

from absl import logging
import ml_collections

from vidjax.config.checks import validate
from vidjax.config.keys import (
  ACCUM_KEY,
  BATCH_KEY,
  EPOCH_KEYS,
  EVAL_BATCH_KEY,
  NUM_FRAMES_KEY,
  OVERRIDES_KEY,
  REPEATS_KEY,
  TUBELET_KEY,
  UNMASK_ACCUM_KEY,
  lookup,
)
from vidjax.config.loading import cpu_variant, load_config, split_overrides

__all__ = [
  "ACCUM_KEY",
  "BATCH_KEY",
  "EPOCH_KEYS",
  "EVAL_BATCH_KEY",
  "NUM_FRAMES_KEY",
  "OVERRIDES_KEY",
  "PATH_KEYS",
  "REPEATS_KEY",
  "TUBELET_KEY",
  "UNMASK_ACCUM_KEY",
  "LockedConfig",
  "changes",
  "copy",
  "cpu_variant",
  "epochs_to_steps",
  "load_config",
  "lock",
  "make_paths_absolute",
  "split_overrides",
  "validate",
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
  repeats = lookup(config, REPEATS_KEY, 1)
  steps_per_epoch = max(1, train_clips // config.batch_size)
  for epochs_key, steps_key in EPOCH_KEYS.items():
    epochs = lookup(config, epochs_key, 0)
    if epochs > 0:
      section, _, name = steps_key.rpartition(".")
      node = lookup(config, section) if section else config
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
    (lookup(config, "data", {}), PATH_KEYS["data"], True),
    (lookup(config, "eval", {}), PATH_KEYS["eval"], True),
    # A distilled student's teacher, named so in its checkpoints.
    (lookup(config, "model.teacher", {}), ("source",), False),
  ]
  for spec in lookup(config, "eval.sets", {}).values():  # Its `eval` keys are
    sections += [
      (lookup(spec, "data", {}), PATH_KEYS["data"], True),  # its own.
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
