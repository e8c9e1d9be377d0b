"""The config keys that code refers to by name, and a dotted lookup."""

from __future__ import annotations

import ml_collections

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

_MISSING = object()


def lookup(config, dotted: str, default=_MISSING):
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
