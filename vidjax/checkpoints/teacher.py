"""A distilled student's frozen teacher: read, settled, loaded, named.

`config.model.teacher.source` names a CLIP as `init_from` does (OpenAI's
`.pt`, OpenCLIP, Hugging Face, AVION / LaViLa, or a vidjax run: its best
checkpoint, else its latest). At start-up (`vidjax.startup`):

    source = teacher.read(config)          # its vision tower's tensors
    lines = teacher.settle(config, source) # sizes, act, eps, checksum
    rest = teacher.load(rest, source)      # into the model's untrained state

`settle` sets the teacher's keys of `config.model.teacher` from the
weights (a value given on the command line that disagrees is an error),
and `checksum`, a digest of the tensors: the config saved with every
checkpoint names the teacher by its source and checksum, while its weights
stay out of the checkpoint (they are `Frozen`: `vidjax.models.umt`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re

from absl import logging
from flax import nnx
import jax
import ml_collections
import numpy as np

from vidjax.base import errors, keypaths
from vidjax.checkpoints import checkpoint_reader, resume
from vidjax.config import defaults
from vidjax.models import umt
from vidjax.weights import init_from, sources

# The teacher's part of the model's untrained state (`umt.UMT.teacher`).
PREFIX = ("teacher", "tower")
# Where the tensors of a CLIP's vision tower are in a `Source`.
VISUAL = "visual."


def read(config) -> init_from.Source:
  """The teacher's vision tower, as a `Source` of kind 'clip' holding only
  its `visual.*` tensors (a vidjax run's facts also name its heads).

  Raises:
    errors.ConfigError: no source is set.
    errors.InitFromError: the source holds no CLIP vision tower.
  """
  teacher = config.model.teacher
  path = teacher.source
  if not path:
    raise errors.ConfigError(
      "model.teacher.source is unset: distillation needs a frozen CLIP",
      hint="set --config.model.teacher.source to a CLIP's weights (e.g. "
      "OpenAI's ViT-B-16.pt) or a vidjax CLIP run's workdir "
      "(docs/recipes.md)",
    )
  facts = {}
  if os.path.isdir(path) and not sources.is_hugging_face(path):
    directory, step = resume.find_checkpoint(path, prefer_best=True)
    if step is not None:
      params, saved = checkpoint_reader.read_params(directory, step)
      source = sources.vidjax_source(
        params, saved, os.path.join(directory, str(step))
      )
      model = saved.get("model") or {}
      if model.get("variant"):
        heads = (
          model.get("heads")
          or defaults.parse_variant(model["variant"])["heads"]
        )
        facts["heads"] = (heads, "the run's config")
    else:
      source = resume.read_init_from(path, allow_pickle=teacher.allow_pickle)
  else:
    source = resume.read_init_from(path, allow_pickle=teacher.allow_pickle)
  visual = {k: v for k, v in source.tensors.items() if k.startswith(VISUAL)}
  if source.kind != "clip" or f"{VISUAL}patch_embed.kernel" not in visual:
    raise errors.InitFromError(
      f"{source.description} holds a {source.kind} model, not a CLIP: "
      "a teacher is a CLIP's vision tower"
    )
  return init_from.Source(
    "clip",
    visual,
    {k: source.names.get(k, k) for k in visual},
    source.description,
    tubelet=source.tubelet,
    facts={**source.facts, **facts},
  )


def checksum(source: init_from.Source) -> str:
  """SHA-256 (first 16 hex digits) of the tensors' names, shapes and
  float32 bytes, in name order."""
  digest = hashlib.sha256()
  for name in sorted(source.tensors):
    value = np.ascontiguousarray(source.tensors[name], np.float32)
    digest.update(f"{name}{value.shape}".encode())
    digest.update(value.tobytes())
  return digest.hexdigest()[:16]


def _sizes(source: init_from.Source) -> dict:
  """The tower's sizes from its tensors (heads: a vidjax run's own, else
  width / 64, as every released CLIP)."""
  tensors = source.tensors
  kernel = tensors[f"{VISUAL}patch_embed.kernel"]
  tubelet = source.tubelet or 1
  width = kernel.shape[1]
  layers = {
    int(m.group(1))
    for m in map(re.compile(r"visual\.blocks\.layers\.(\d+)\.").match, tensors)
    if m
  }
  heads = source.facts.get("heads", (width // 64,))[0]
  return dict(
    variant=f"B/{math.isqrt(kernel.shape[0] // (3 * tubelet))}",
    width=width,
    depth=len(layers),
    heads=heads,
    mlp_dim=tensors[f"{VISUAL}blocks.layers.0.mlp.fc1.kernel"].shape[1],
    embed_dim=tensors[f"{VISUAL}proj.kernel"].shape[1],
  )


def settle(config, source: init_from.Source) -> list[str]:
  """Sets `config.model.teacher` from the weights (in place).

  Returns:
    One line per key changed ('model.teacher.width: None -> 768').

  Raises:
    errors.InitFromError: a key given on the command line disagrees.
  """
  teacher = config.model.teacher
  values = _sizes(source)
  for key in ("act", "ln_eps"):
    if key in source.facts:
      values[key] = source.facts[key][0]
  values["checksum"] = checksum(source)
  given = set(config.get("overrides", ()))
  lines, conflicts = [], []
  for key, value in values.items():
    if teacher[key] == value:
      continue
    if f"model.teacher.{key}" in given:
      conflicts.append(
        f"model.teacher.{key}={teacher[key]!r}, weights {value!r}"
      )
      continue
    lines.append(f"model.teacher.{key}: {teacher[key]!r} -> {value!r}")
    teacher[key] = value
  layers = config.model.align_layers
  if teacher.depth < layers:
    raise errors.ConfigError(
      f"model.align_layers={layers} but the teacher {source.description} "
      f"has {teacher.depth} blocks",
      hint=f"set --config.model.align_layers to {teacher.depth} or fewer",
    )
  if conflicts:
    raise errors.InitFromError(
      f"the teacher {source.description} is not the one the command line "
      "describes:\n  " + "\n  ".join(conflicts),
      hint="leave these keys unset: the teacher's weights decide them",
    )
  return lines


def _tower(rest):
  """The teacher's `Frozen` weights in the model's untrained state."""
  for key in PREFIX:
    rest = rest[key]
  return nnx.filter_state(rest, umt.Frozen)


def load(rest, source: init_from.Source):
  """The model's untrained state with the teacher's weights, each on the
  sharding of the value it replaces.

  Returns:
    (rest, `init_from.Report`).
  """
  clip = ml_collections.ConfigDict(dict(name="clip", tubelet=1))
  loaded, report = init_from.load_params({"visual": _tower(rest)}, clip, source)
  values = {
    keypaths.name(path): value
    for path, value in jax.tree_util.tree_flatten_with_path(loaded)[0]
  }
  prefix = ".".join(PREFIX) + "."

  def put(path, value):
    name = keypaths.name(path)
    if name.startswith(prefix):
      return values.get("visual." + name[len(prefix) :], value)
    return value

  logging.info("teacher: %s", report.summary())
  return jax.tree_util.tree_map_with_path(put, rest), report


def leaves(rest) -> dict[str, np.ndarray]:
  """The teacher's weights in the untrained state, as host arrays by name
  ('patch_embed.kernel', ...)."""
  return {
    keypaths.name(path): np.asarray(value)
    for path, value in jax.tree_util.tree_flatten_with_path(_tower(rest))[0]
  }
