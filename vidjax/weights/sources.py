"""What `init_from` names, as an `init_from.Source`.

* a weights file: `tensor_io.load_state_dict`, then `weights.convert`, with
  the facts `vidjax.export` recorded in it (`facts.recorded`); its own
  safetensors format (vidjax's names and the run's config) as a run's;
* a Hugging Face `save_pretrained` directory: its config.json (what the
  model computed with, `facts`) and its weights (`HF_WEIGHTS`, sharded or
  not);
* a vidjax run's parameters and the config saved with them
  (`vidjax_source`; `vidjax.checkpoints.resume.read_init_from` finds and reads the
  checkpoint: the run's best if recorded, else its latest, or one step).
"""

from __future__ import annotations

import json
import os

from vidjax.base import errors
from vidjax.weights import facts as facts_lib, init_from, tensor_io
from vidjax.weights.conversion import convert
from vidjax.weights.tensor_io import load_state_dict


def vidjax_source(
  params: dict, config: dict, description: str
) -> init_from.Source:
  """A vidjax run's parameters, as `checkpoint_reader.read_params` reads them
  ({dotted path: array}, and the config dict saved with them); scanned
  layers are unstacked."""
  tensors = {}
  for path, value in params.items():
    if init_from.is_stacked(path):
      tensors.update(zip(init_from.layer_names(path, len(value)), value))
    else:
      tensors[path] = value
  # The saved run's config, read back from its checkpoint: may be empty.
  model = config.get("model", {})
  kind = model.get("name") or (
    "clip"
    if "text.pos_embed" in tensors
    else "videomae"
    if "mask_token" in tensors
    else "classifier"
  )
  backbone = {"clip": "clip", "videomae": "videomae"}.get(kind) or (
    "clip" if "encoder.class_token" in tensors else "videomae"
  )
  temperature = tensors.get("logit_scale")
  facts = facts_lib.run_facts(
    config, None if temperature is None else float(temperature)
  )
  return init_from.Source(
    kind,
    tensors,
    {p: p for p in tensors},
    f"{description} (vidjax {kind})",
    tubelet=model.get("tubelet"),
    backbone=backbone,
    facts=facts,
  )


# A `save_pretrained` directory's weights: one file, or shards and an index.
HF_WEIGHTS = (
  "model.safetensors",
  "model.safetensors.index.json",
  "pytorch_model.bin",
  "pytorch_model.bin.index.json",
)


def _hugging_face_source(path: str, allow_pickle: bool) -> init_from.Source:
  """A Hugging Face `save_pretrained` directory: config.json and weights."""
  config_path = os.path.join(path, "config.json")
  try:
    with open(config_path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.InitFromError(
      f"{config_path}: not readable as JSON ({e})"
    ) from None
  if config.get("model_type") not in ("clip", "videomae"):
    raise errors.InitFromError(
      f"{config_path}: model_type {config.get('model_type')!r}; vidjax "
      "reads Hugging Face's 'clip' and 'videomae' models"
    )
  name = next(n for n in HF_WEIGHTS if os.path.isfile(os.path.join(path, n)))
  files = [name]
  if name.endswith(".index.json"):
    with open(os.path.join(path, name), encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  state_dict = {}
  for file in files:
    state_dict.update(
      load_state_dict(os.path.join(path, file), allow_pickle=allow_pickle)
    )
  source = convert(state_dict, path, hf_config=config)
  source.facts.update(facts_lib.recorded(config))
  return source


def is_hugging_face(path: str) -> bool:
  """Whether `path` is a `save_pretrained` directory (config.json and
  weights)."""
  listed = os.listdir(path) if os.path.isdir(path) else []
  return "config.json" in listed and bool(set(HF_WEIGHTS) & set(listed))


def read_source(path: str, *, allow_pickle: bool = False) -> init_from.Source:
  """A weights file or a Hugging Face directory, as a `Source`.

  Args:
    path: a weights file (see `load_state_dict`) or a Hugging Face
      `save_pretrained` directory (config.json and `HF_WEIGHTS`).
    allow_pickle: see `load_state_dict`.

  Raises:
    errors.PathError: a directory that is neither (nor a vidjax run, which
      `vidjax.checkpoints.resume.read_init_from` reads).
  """
  if is_hugging_face(path):
    return _hugging_face_source(path, allow_pickle)
  if os.path.isdir(path):
    listed = os.listdir(path)
    files = sorted(
      f
      for f in listed
      if f.endswith((".safetensors", ".npz") + tensor_io.TORCH_SUFFIXES)
    )
    raise errors.PathError(
      f"{path}: neither a complete vidjax checkpoint (a workdir, its "
      "checkpoints/ directory or one step directory) nor a Hugging Face "
      f"save_pretrained directory (config.json and one of {HF_WEIGHTS})"
      + (f"; to load a weights file, name it: {files}" if files else "")
    )
  extras = {}
  state_dict = load_state_dict(path, allow_pickle=allow_pickle, extras=extras)
  if facts_lib.RUN_CONFIG in extras:  # vidjax.export's own format.
    config = json.loads(extras[facts_lib.RUN_CONFIG])
    return vidjax_source(state_dict, config, path)
  source = convert(state_dict, path)
  source.facts.update(facts_lib.recorded(extras))
  return source
