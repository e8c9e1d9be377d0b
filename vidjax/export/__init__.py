"""A trained model out: `python -m vidjax.export RUN_OR_STEP OUT --format F`.

The inverse of `--config.init_from`: a run's parameters (its best
checkpoint if recorded, else its latest complete one, or the step directory
named) written in the layout another codebase's own code loads
(`formats.FORMATS`: AVION/LaViLa, OpenCLIP, Hugging Face VideoMAE, or
vidjax's own names), with a model card (`card.py`, OUT/README.md). Exporting
then importing with `init_from` gives the same parameters, bit for bit
(the formats' few exceptions are said in the card: a one-frame CLIP's
temporal row folded into its positions, Hugging Face's missing key bias).

OUT is written whole or not at all: into a hidden sibling directory,
renamed to OUT at the end; an existing OUT is never overwritten.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from pathlib import Path
import shutil
import tempfile

from absl import logging
import ml_collections
import numpy as np
import safetensors.numpy

from vidjax.base import errors
from vidjax.checkpoints import checkpoint_reader, resume
from vidjax.config import defaults
from vidjax.export import card as card_lib, formats
from vidjax.export.formats import FORMATS, Model
from vidjax.models import spec as spec_lib
from vidjax.weights import facts as facts_lib, sources

__all__ = ["FORMATS", "Checkpoint", "export", "read_model"]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Where an exported model came from: the checkpoints directory, the step,
  the run's workdir (its metrics.jsonl), and how the step was chosen."""

  directory: str
  step: int
  workdir: str
  chosen: str


def _model_config(saved: dict) -> ml_collections.ConfigDict:
  """The saved `config.model` over today's defaults (keys added since)."""
  config = defaults.model_config(saved.get("name") or "clip")

  def merge(into, values):
    for key, value in values.items():
      if key not in into:
        continue
      if isinstance(into[key], ml_collections.ConfigDict):
        merge(into[key], value or {})
      else:
        into[key] = tuple(value) if isinstance(value, list) else value

  merge(config, saved)
  return config


def read_model(path, *, frames: int | None = None) -> tuple[Model, Checkpoint]:
  """A run's checkpoint, read as the model export writes.

  Args:
    path: a run's workdir or checkpoints directory (its best step if
      recorded, else the latest complete one), or one step directory.
    frames: 1 to export a video CLIP as it embeds one frame.

  Raises:
    errors.PathError: no such path.
    errors.WorkdirError: no complete checkpoint there, or it is damaged.
  """
  if not os.path.exists(path):
    raise errors.PathError(f"{path}: no such run or checkpoint directory")
  directory, step = resume.find_checkpoint(path, prefer_best=True)
  if step is None:
    raise errors.WorkdirError(
      f"{path}: no checkpoint to export (no complete step in {directory})",
      hint="name a run's workdir, its checkpoints/ directory or one step "
      "directory; a run saves every checkpoint.every_steps and at its end",
    )
  best = checkpoint_reader.read_best(directory)
  chosen = (
    "the step named"
    if os.path.basename(os.path.normpath(path)) == str(step)
    else f"the best by {best['metric']}"
    if best and best.get("step") == step
    else "the latest complete step"
  )
  params, config = checkpoint_reader.read_params(directory, step)
  if not config.get("model"):
    raise errors.WorkdirError(
      f"{directory}/{step}: saved without its config, so what the model "
      "computed with (activation, LayerNorm eps, pooling) is unknown",
      hint="export a checkpoint written by this vidjax version",
    )
  source = sources.vidjax_source(params, config, f"{directory}/{step}")
  temperature = source.tensors.get("logit_scale")
  spec = spec_lib.from_config(_model_config(config["model"]))
  facts = facts_lib.run_facts(
    config, None if temperature is None else float(temperature)
  )
  if source.kind == "classifier":  # Recorded whole: None is the blocks' eps.
    head_eps = spec.encoder.head_ln_eps
    facts.setdefault(
      "head_ln_eps",
      (spec.encoder.blocks.ln_eps if head_eps is None else head_eps, "spec"),
    )
  model = Model(
    kind=source.kind,
    spec=spec,
    tensors={k: np.asarray(v) for k, v in source.tensors.items()},
    params=params,
    config=config,
    facts=facts,
    frames=frames,
  )
  workdir = os.path.dirname(os.path.normpath(os.fspath(directory)))
  return model, Checkpoint(os.fspath(directory), step, workdir, chosen)


def _torch_tree(value):
  """numpy arrays -> torch tensors, in dicts (a torch.save of the .pt)."""
  import torch

  if isinstance(value, dict):
    return {k: _torch_tree(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    return torch.from_numpy(np.asarray(value, order="C"))
  return value


def _write(files: formats.Files, card_text: str, directory: Path) -> None:
  for name, (state_dict, metadata) in files.tensors.items():
    arrays = {k: np.asarray(v, order="C") for k, v in state_dict.items()}
    safetensors.numpy.save_file(arrays, directory / name, metadata=metadata)
  for name, obj in files.pickles.items():
    import torch

    torch.save(_torch_tree(obj), directory / name)
  for name, blob in files.json.items():
    (directory / name).write_text(json.dumps(blob, indent=2) + "\n")
  (directory / "README.md").write_text(card_text)


def export(path, out, fmt: str, *, frames: int | None = None) -> formats.Files:
  """Writes the model of a run's checkpoint to OUT in format `fmt`.

  Args:
    path: see `read_model`.
    out: the directory to create (it must not exist).
    fmt: one of `FORMATS`.
    frames: see `read_model`.

  Returns:
    What was written (`formats.Files`: files, notes, files skipped).

  Raises:
    errors.ConfigError: an unknown format, one that cannot hold the model
      (naming what), or an OUT that exists.
    errors.PathError, errors.WorkdirError: see `read_model`.
  """
  if fmt not in FORMATS:
    raise errors.ConfigError(
      f"--format {fmt!r}: not one of {', '.join(FORMATS)}"
    )
  out = Path(out).absolute()
  if out.exists() or out.is_symlink():
    raise errors.ConfigError(
      f"{out} exists: export writes a new directory and never overwrites",
      hint="name a new OUT, or remove the old one first",
    )
  model, checkpoint = read_model(path, frames=frames)
  files = FORMATS[fmt](model)
  text = card_lib.model_card(model, checkpoint, fmt, files, os.fspath(out))
  out.parent.mkdir(parents=True, exist_ok=True)
  stale = glob.glob(os.path.join(out.parent, f".{out.name}.partial-*"))
  if stale:
    logging.warning(
      "left by an export that was stopped before it finished (OUT was "
      "never created): %s; remove them",
      ", ".join(stale),
    )
  partial = Path(
    tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent)
  )
  try:
    _write(files, text, partial)
    if out.exists():  # Made by someone else meanwhile.
      raise errors.ConfigError(f"{out} appeared while exporting: not replaced")
    os.rename(partial, out)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  return files
