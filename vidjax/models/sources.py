"""What `init_from` names, or a run restarts from, as an `init_from.Source`.

* a weights file: `tensor_io.load_state_dict`, then `weights.convert`;
* a Hugging Face `save_pretrained` directory: its config.json (what the
  model computed with, `facts`) and its weights (`HF_WEIGHTS`, sharded or
  not);
* a vidjax run: its workdir or checkpoints directory (the best checkpoint
  if recorded, else the latest) or one step directory: its parameters and
  the config saved with them.

`read_start` is what `train.setup` reads before it builds the model: every
tensor of `init_from`, or only the config a checkpoint to resume was saved
with (its facts: what the run computed with).
"""
from __future__ import annotations

import json
import os

from vidjax import checkpoint, errors, resume
from vidjax.models import facts as facts_lib, init_from, tensor_io
from vidjax.models.tensor_io import load_state_dict
from vidjax.models.weights import convert


def _vidjax_source(params: dict, config: dict, description: str
                   ) -> init_from.Source:
  """A vidjax run's parameters; scanned layers are unstacked."""
  tensors = {}
  for path, value in params.items():
    if init_from.is_stacked(path):
      tensors.update(zip(init_from.layer_names(path, len(value)), value))
    else:
      tensors[path] = value
  # The saved run's config, read back from its checkpoint: may be empty.
  model = config.get('model', {})
  kind = model.get('name') or (
      'clip' if 'text.pos_embed' in tensors else
      'videomae' if 'mask_token' in tensors else 'classifier')
  backbone = {'clip': 'clip', 'videomae': 'videomae'}.get(kind) or (
      'clip' if 'encoder.class_token' in tensors else 'videomae')
  temperature = tensors.get('logit_scale')
  facts = facts_lib.run_facts(
      config, None if temperature is None else float(temperature))
  return init_from.Source(kind, tensors, {p: p for p in tensors},
                          f'{description} (vidjax {kind})',
                          tubelet=model.get('tubelet'), backbone=backbone,
                          facts=facts)


# A `save_pretrained` directory's weights: one file, or shards and an index.
HF_WEIGHTS = ('model.safetensors', 'model.safetensors.index.json',
              'pytorch_model.bin', 'pytorch_model.bin.index.json')


def _hugging_face_source(path: str, allow_pickle: bool) -> init_from.Source:
  """A Hugging Face `save_pretrained` directory: config.json and weights."""
  config_path = os.path.join(path, 'config.json')
  try:
    with open(config_path, encoding='utf-8') as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.InitFromError(f'{config_path}: not readable as JSON ({e})'
                               ) from None
  if config.get('model_type') not in ('clip', 'videomae'):
    raise errors.InitFromError(
        f"{config_path}: model_type {config.get('model_type')!r}; vidjax "
        "reads Hugging Face's 'clip' and 'videomae' models")
  name = next(n for n in HF_WEIGHTS if os.path.isfile(os.path.join(path, n)))
  files = [name]
  if name.endswith('.index.json'):
    with open(os.path.join(path, name), encoding='utf-8') as f:
      files = sorted(set(json.load(f)['weight_map'].values()))
  state_dict = {}
  for file in files:
    state_dict.update(load_state_dict(os.path.join(path, file),
                                      allow_pickle=allow_pickle))
  return convert(state_dict, path, hf_config=config)


def read_source(path: str, *, allow_pickle: bool = False) -> init_from.Source:
  """What `config.init_from` names, as a `Source`.

  Args:
    path: a weights file (see `load_state_dict`), a Hugging Face
      `save_pretrained` directory (config.json and `HF_WEIGHTS`), or a
      vidjax run: its workdir or checkpoints directory (the best checkpoint
      if recorded, else the latest) or one checkpoint step directory.
    allow_pickle: see `load_state_dict`.
  """
  if os.path.isdir(path):
    listed = os.listdir(path)
    if 'config.json' in listed and set(HF_WEIGHTS) & set(listed):
      return _hugging_face_source(path, allow_pickle)
    directory, step = resume.find_checkpoint(path, prefer_best=True)
    if step is not None:
      params, config = checkpoint.read_params(directory, step)
      return _vidjax_source(params, config, os.path.join(directory, str(step)))
    files = sorted(f for f in listed if f.endswith(
        ('.safetensors', '.npz') + tensor_io.TORCH_SUFFIXES))
    raise errors.PathError(
        f'{path}: neither a complete vidjax checkpoint (a workdir, its '
        'checkpoints/ directory or one step directory) nor a Hugging Face '
        f'save_pretrained directory (config.json and one of {HF_WEIGHTS})'
        + (f'; to load a weights file, name it: {files}' if files else ''))
  return convert(load_state_dict(path, allow_pickle=allow_pickle), path)


def read_start(start: resume.StartPoint, *, allow_pickle: bool = False
               ) -> init_from.Source | None:
  """The source of a run's weights, read before its model is built.

  'init_from': `read_source` (every tensor). 'workdir' and 'resume': the
  checkpoint's saved config only, for its facts (what the run trained
  with); its state is restored later. 'scratch': None.
  """
  if start.kind == 'init_from':
    return read_source(start.path, allow_pickle=allow_pickle)
  if start.kind not in ('workdir', 'resume'):
    return None
  config = checkpoint.read_config(start.path, start.step)
  kind = (config.get('model') or {}).get('name') or 'run'
  return init_from.Source(kind, {}, {},
                          f'{start.path}/{start.step} (vidjax {kind})',
                          facts=facts_lib.run_facts(config))
