"""Weight import: OpenAI/OpenCLIP CLIP and VideoMAE checkpoints into our models.

A state dict (name -> numpy array or torch tensor) is renamed into our
parameter paths, reshaped (PyTorch Linear weights are transposed, conv patch
embeddings become the tubelet kernel), and written into a model whose sizes
come from the state dict's shapes. Positional embeddings are interpolated
when the image size or frame count differs, and 2-D patch embeddings are
inflated to tubelets. Anything that does not fit raises one error listing
the missing names, the unexpected names and the shapes that differ.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Callable

import jax
import numpy as np
from flax import nnx

from vidjax.models.clip import CLIP
from vidjax.models.tensor_io import (conv_to_kernel, inflate_patch_embed,
                                     interpolate_pos_embed,
                                     interpolate_temporal, load_state_dict,
                                     to_numpy)
from vidjax.models.videomae import Classifier, VideoMAE

__all__ = ['classifier_from_state_dict', 'clip_config_from_state_dict',
           'clip_from_state_dict', 'conv_to_kernel', 'inflate_patch_embed',
           'interpolate_pos_embed', 'interpolate_temporal', 'load_classifier',
           'load_clip', 'load_state_dict', 'load_videomae',
           'videomae_config_from_state_dict', 'videomae_from_state_dict']

# --------------------------------------------------------------- name maps

# A transform takes (source array, target shape) and returns the target.
Transform = Callable[[np.ndarray, tuple], np.ndarray]


def _transpose(x, shape):
  del shape
  return x.T


def _patch(mode: str) -> Transform:
  def transform(weight, shape):
    pixels = weight.shape[1] * weight.shape[-1] * weight.shape[-2]
    return conv_to_kernel(inflate_patch_embed(weight, shape[0] // pixels, mode))
  return transform


def _spatial_pos(table, shape):
  return interpolate_pos_embed(table, shape[0])


def _temporal_pos(table, shape):
  return interpolate_temporal(table, shape[0])


def _reshape(x, shape):
  return x.reshape(shape)


def _linear(src: str, dst: str):
  """PyTorch Linear `src` -> our nnx.Linear `dst` (kernel transposed)."""
  return {f'{src}.weight': (f'{dst}.kernel', _transpose),
          f'{src}.bias': (f'{dst}.bias', None)}


def _norm(src: str, dst: str):
  return {f'{src}.weight': (f'{dst}.scale', None),
          f'{src}.bias': (f'{dst}.bias', None)}


CLIP_BLOCK = {
    **_norm('ln_1', 'norm1'), **_norm('ln_2', 'norm2'),
    'attn.in_proj_weight': ('attn.qkv.kernel', _transpose),
    'attn.in_proj_bias': ('attn.qkv.bias', None),
    **_linear('attn.out_proj', 'attn.out'),
    **_linear('mlp.c_fc', 'mlp.fc1'), **_linear('mlp.c_proj', 'mlp.fc2'),
}
VIDEOMAE_BLOCK = {
    **_norm('norm1', 'norm1'), **_norm('norm2', 'norm2'),
    **_linear('attn.qkv', 'attn.qkv'), **_linear('attn.proj', 'attn.out'),
    **_linear('mlp.fc1', 'mlp.fc1'), **_linear('mlp.fc2', 'mlp.fc2'),
}


def _clip_names(patch_mode: str) -> tuple[dict, list]:
  top = {
      'visual.conv1.weight': ('visual.patch_embed.kernel', _patch(patch_mode)),
      'visual.class_embedding': ('visual.class_token', None),
      'visual.positional_embedding': ('visual.spatial_pos', _spatial_pos),
      # Video CLIPs (LaViLa/AVION) add a temporal table; image CLIPs do not.
      'visual.temporal_embedding': ('visual.temporal_pos', _temporal_pos),
      **_norm('visual.ln_pre', 'visual.pre_norm'),
      **_norm('visual.ln_post', 'visual.norm'),
      'visual.proj': ('visual.proj.kernel', None),
      'token_embedding.weight': ('text.token_embed.embedding', None),
      'positional_embedding': ('text.pos_embed', None),
      **_norm('ln_final', 'text.norm'),
      'text_projection': ('text.proj.kernel', None),
      'logit_scale': ('logit_scale', None),
  }
  blocks = [(r'visual\.transformer\.resblocks\.(\d+)\.', 'visual.blocks.layers',
             CLIP_BLOCK),
            (r'transformer\.resblocks\.(\d+)\.', 'text.blocks.layers',
             CLIP_BLOCK)]
  return top, blocks


def _videomae_names() -> tuple[dict, list]:
  top = {
      'encoder.patch_embed.proj.weight': ('encoder.patch_embed.kernel',
                                          _patch('center')),
      'encoder.patch_embed.proj.bias': ('encoder.patch_embed.bias', None),
      **_norm('encoder.norm', 'encoder.norm'),
      **_norm('encoder.fc_norm', 'encoder.norm'),  # fine-tuned, mean pooling
      **_linear('encoder.head', 'head'),
      'encoder_to_decoder.weight': ('encoder_to_decoder.kernel', _transpose),
      'mask_token': ('mask_token', _reshape),
      **_norm('decoder.norm', 'decoder_norm'),
      **_linear('decoder.head', 'decoder_head'),
  }
  blocks = [(r'encoder\.blocks\.(\d+)\.', 'encoder.blocks.layers',
             VIDEOMAE_BLOCK),
            (r'decoder\.blocks\.(\d+)\.', 'decoder.layers', VIDEOMAE_BLOCK)]
  return top, blocks


def _rename(state_dict: dict, names: tuple[dict, list]) -> tuple[dict, list]:
  """-> ({our dotted path: (array, transform, source name)}, unmatched)."""
  top, blocks = names
  mapped, unmatched = {}, []
  for name, value in state_dict.items():
    if name in top:
      dst, transform = top[name]
    else:
      for pattern, dst_prefix, table in blocks:
        match = re.match(pattern, name)
        if match and name[match.end():] in table:
          dst, transform = table[name[match.end():]]
          dst = f'{dst_prefix}.{match.group(1)}.{dst}'
          break
      else:
        unmatched.append(name)
        continue
    mapped[dst] = (value, transform, name)
  return mapped, unmatched


def _canonical_videomae(state_dict: dict) -> dict:
  """Hugging Face or fine-tuned VideoMAE names -> the original pretraining's.

  The original release names the encoder 'encoder.blocks.<i>.attn.qkv' with
  separate 'q_bias'/'v_bias' (keys have no bias); fine-tuned checkpoints drop
  the 'encoder.' prefix; Hugging Face splits query/key/value.
  """
  hf_prefixes = [
      ('videomae.embeddings.patch_embeddings.projection.',
       'encoder.patch_embed.proj.'),
      ('videomae.encoder.layer.', 'encoder.blocks.'),
      ('decoder.decoder_layers.', 'decoder.blocks.'),
      ('videomae.layernorm.', 'encoder.norm.'),
      ('fc_norm.', 'encoder.fc_norm.'), ('classifier.', 'encoder.head.'),
  ]
  hf_block_parts = [  # in order: 'attention.output.dense' before 'output.dense'
      ('.attention.attention.', '.attn.'),
      ('.attention.output.dense.', '.attn.proj.'),
      ('.layernorm_before.', '.norm1.'), ('.layernorm_after.', '.norm2.'),
      ('.intermediate.dense.', '.mlp.fc1.'), ('.output.dense.', '.mlp.fc2.'),
  ]
  is_hf = any(name.startswith('videomae.') for name in state_dict)
  is_finetuned = 'patch_embed.proj.weight' in state_dict
  renamed = {}
  for name, value in state_dict.items():
    if is_hf:
      for old, new in hf_prefixes:
        if name.startswith(old):
          name = new + name[len(old):]
      for old, new in hf_block_parts:
        name = name.replace(old, new, 1)
    elif is_finetuned:
      name = f'encoder.{name}'
    renamed[name] = value
  out = {}
  for name, value in renamed.items():
    stem, _, leaf = name.rpartition('.attn.')
    if leaf == 'query.weight':
      out[f'{stem}.attn.qkv.weight'] = np.concatenate(
          [value, renamed[f'{stem}.attn.key.weight'],
           renamed[f'{stem}.attn.value.weight']])
    elif leaf in ('key.weight', 'value.weight'):
      continue
    elif leaf == 'q_bias':
      v_bias = renamed[f'{stem}.attn.v_bias']
      out[f'{stem}.attn.qkv.bias'] = np.concatenate(
          [value, np.zeros_like(value), v_bias])
    elif leaf != 'v_bias':
      out[name] = value
  for name in list(out):  # blocks trained without QKV bias: zeros are exact
    if name.endswith('.attn.qkv.weight'):
      bias_name = name.replace('.weight', '.bias')
      out.setdefault(bias_name, np.zeros(out[name].shape[0], np.float32))
  return out


# ---------------------------------------------------------------- assembly


def _dotted(path) -> str:
  return '.'.join(str(part) for part in path)


def _assemble(make: Callable[[], nnx.Module], mapped: dict, *,
              unexpected: list, optional: tuple = (), source: str):
  """Builds `make()` with the mapped arrays, or raises listing every problem.

  Args:
    make: builds the model (run abstractly; only unloaded state is computed).
    mapped: from `_rename`.
    unexpected: source names that matched nothing.
    optional: path prefixes that may stay at their initial values.
    source: what the arrays came from, for messages.
  """
  abstract = nnx.eval_shape(make)
  variables = {_dotted(p): v for p, v in nnx.to_flat_state(nnx.state(abstract))}
  params = {name for name, v in variables.items() if isinstance(v, nnx.Param)}
  values, mismatched, stacks, seen = {}, [], {}, set()
  for dst, (value, transform, src) in mapped.items():
    stacked = re.sub(r'\.layers\.(\d+)\.', '.layers.', dst)
    if dst not in params and stacked in params:  # scan: one [depth, ...] array
      layer = int(re.search(r'\.layers\.(\d+)\.', dst).group(1))
      stacks.setdefault(stacked, {})[layer] = (value, transform, src)
      continue
    if dst not in params:
      unexpected.append(src)
      continue
    shape = variables[dst].get_value().shape
    converted = transform(value, shape) if transform else value
    if converted.shape != shape:
      mismatched.append(f'{src} {value.shape} -> {dst} {shape}')
      seen.add(dst)
    else:
      values[dst] = converted
  for dst, layers in stacks.items():
    shape = variables[dst].get_value().shape
    seen.add(dst)
    if sorted(layers) != list(range(shape[0])):
      mismatched.append(f'{dst}: layers {sorted(layers)} for depth {shape[0]}')
      continue
    converted = [t(v, shape[1:]) if t else v for v, t, _ in
                 (layers[i] for i in range(shape[0]))]
    if any(c.shape != shape[1:] for c in converted):
      mismatched.append(f'{layers[0][2]} {layers[0][0].shape} -> {dst} {shape}')
    else:
      values[dst] = np.stack(converted)
  missing = sorted(p for p in params - set(values) - seen
                   if not p.startswith(optional))
  if missing or unexpected or mismatched:
    def listing(title, names):
      shown = ', '.join(names[:30]) + (' ...' if len(names) > 30 else '')
      return f'\n  {title} ({len(names)}): {shown}' if names else ''
    raise ValueError(
        f'{source} does not fit {type(abstract).__name__}:'
        + listing('missing', missing)
        + listing('unexpected', sorted(unexpected))
        + listing('shapes differ', mismatched))
  # Unloaded state (RNG streams, optional params) from a jitted init that
  # XLA prunes to just those variables.
  rest = jax.jit(lambda: nnx.state(
      make(), lambda path, _: _dotted(path) not in values))()
  rest = {_dotted(p): v.get_value() for p, v in nnx.to_flat_state(rest)}
  for path, variable in nnx.to_flat_state(nnx.state(abstract)):
    name = _dotted(path)
    variable.set_value(jax.numpy.asarray(values[name]) if name in values
                       else rest[name])
  return abstract


# ------------------------------------------------------------------ public


def _count(state_dict: dict, pattern: str) -> int:
  return len({m.group(1) for m in map(re.compile(pattern).match, state_dict)
              if m})


def _require(state_dict: dict, name: str, kind: str) -> np.ndarray:
  if name not in state_dict:
    raise ValueError(f'not a {kind} state dict: it has no {name!r} '
                     f'(first names: {list(state_dict)[:5]})')
  return to_numpy(state_dict[name])


def clip_config_from_state_dict(state_dict: dict) -> dict:
  """CLIP constructor sizes read off an OpenAI/OpenCLIP state dict's shapes."""
  conv = _require(state_dict, 'visual.conv1.weight', 'CLIP')
  positions = _require(state_dict, 'visual.positional_embedding', 'CLIP')
  text_width = _require(state_dict, 'ln_final.weight', 'CLIP').shape[0]
  width, patch = conv.shape[0], conv.shape[-1]
  config = dict(
      embed_dim=_require(state_dict, 'text_projection', 'CLIP').shape[1],
      image_size=math.isqrt(positions.shape[0] - 1) * patch, patch_size=patch,
      vision_width=width, vision_heads=width // 64,
      vision_depth=_count(state_dict, r'visual\.transformer\.resblocks\.(\d+)'),
      vision_mlp_dim=_require(
          state_dict, 'visual.transformer.resblocks.0.mlp.c_fc.weight',
          'CLIP').shape[0],
      vocab_size=_require(state_dict, 'token_embedding.weight',
                          'CLIP').shape[0],
      context_length=_require(state_dict, 'positional_embedding',
                              'CLIP').shape[0],
      text_width=text_width, text_heads=text_width // 64,
      text_depth=_count(state_dict, r'transformer\.resblocks\.(\d+)'))
  if 'logit_scale' in state_dict:
    config['logit_scale_init'] = float(to_numpy(state_dict['logit_scale']))
  return config


def clip_from_state_dict(state_dict: dict, *, num_frames: int = 1,
                         patch_inflation: str = 'center',
                         rngs: nnx.Rngs | None = None,
                         keep_init: tuple[str, ...] = (), **overrides) -> CLIP:
  """A video-text CLIP from an OpenAI/OpenCLIP state dict.

  Args:
    state_dict: names such as 'visual.transformer.resblocks.0.attn.
      in_proj_weight' -> numpy arrays or torch tensors.
    num_frames: frames per clip; the temporal embedding starts at zero
      unless the state dict has 'visual.temporal_embedding'.
    patch_inflation: 'center' or 'average', when `tubelet` > 1.
    rngs: for the few variables not loaded (default nnx.Rngs(0)).
    keep_init: model parameter prefixes (e.g. 'visual.proj', 'text.proj',
      'logit_scale') left at their initial values instead of loaded, as
      AVION does for the projections when it changes `embed_dim`.
    **overrides: CLIP constructor arguments, e.g. act='gelu' for OpenCLIP
      models trained with GELU (the state dict does not say), image_size
      (positional embeddings are interpolated), dtype, attention, remat.

  Returns:
    The CLIP model; `encode_video`/`encode_text` as in DESIGN.md §3.
  """
  state_dict = {name: to_numpy(value) for name, value in state_dict.items()}
  kwargs = dict(clip_config_from_state_dict(state_dict),
                num_frames=num_frames, **overrides)
  mapped, unexpected = _rename(state_dict, _clip_names(patch_inflation))
  keep_init = tuple(keep_init)
  mapped = {dst: item for dst, item in mapped.items()
            if not dst.startswith(keep_init)}
  return _assemble(lambda: CLIP(**kwargs, rngs=rngs or nnx.Rngs(0)), mapped,
                   unexpected=unexpected,
                   optional=('visual.temporal_pos',) + keep_init,
                   source='CLIP state dict')


def videomae_config_from_state_dict(state_dict: dict) -> dict:
  """Encoder (and decoder, if present) sizes of a canonical VideoMAE dict."""
  conv = _require(state_dict, 'encoder.patch_embed.proj.weight', 'VideoMAE')
  width = conv.shape[0]
  config = dict(width=width, heads=width // 64, tubelet=conv.shape[2],
                patch_size=conv.shape[-1],
                depth=_count(state_dict, r'encoder\.blocks\.(\d+)'),
                mlp_dim=state_dict['encoder.blocks.0.mlp.fc1.weight'].shape[0])
  if 'encoder_to_decoder.weight' in state_dict:
    decoder_width = state_dict['encoder_to_decoder.weight'].shape[0]
    config.update(decoder_width=decoder_width,
                  decoder_heads=decoder_width // 64,
                  decoder_depth=_count(state_dict, r'decoder\.blocks\.(\d+)'))
  return config


def videomae_from_state_dict(state_dict: dict, *, rngs: nnx.Rngs | None = None,
                             **overrides) -> VideoMAE:
  """A VideoMAE pretraining model from an original or Hugging Face checkpoint.

  Sizes come from the shapes (heads = width / 64); image_size and
  num_frames (not stored: positions are sinusoid) default to 224 and 16.
  """
  state_dict = _canonical_videomae(
      {name: to_numpy(value) for name, value in state_dict.items()})
  kwargs = dict(videomae_config_from_state_dict(state_dict), **overrides)
  mapped, unexpected = _rename(state_dict, _videomae_names())
  return _assemble(lambda: VideoMAE(**kwargs, rngs=rngs or nnx.Rngs(0)),
                   mapped, unexpected=unexpected,
                   source='VideoMAE state dict')


def classifier_from_state_dict(state_dict: dict, *, num_classes: int,
                               patch_inflation: str = 'center',
                               rngs: nnx.Rngs | None = None,
                               **overrides) -> Classifier:
  """A classifier initialised from a CLIP or a VideoMAE checkpoint.

  CLIP: the vision tower (its projection and the text tower are dropped),
  backbone='clip'. VideoMAE (pretrained or fine-tuned, original or Hugging
  Face naming): the encoder, backbone='videomae'. The head is loaded only if
  the checkpoint has one with `num_classes` outputs; otherwise it starts
  fresh (logged).
  """
  state_dict = {name: to_numpy(value) for name, value in state_dict.items()}
  if 'visual.conv1.weight' in state_dict:
    clip = clip_config_from_state_dict(state_dict)
    kwargs = dict(backbone='clip', tubelet=1, num_frames=1,
                  image_size=clip['image_size'], patch_size=clip['patch_size'],
                  **{key: clip[f'vision_{key}'] for key in
                     ('width', 'depth', 'heads', 'mlp_dim')})
    mapped, unexpected = _rename(state_dict, _clip_names(patch_inflation))
    # The text tower and the projection are dropped on purpose.
    mapped = {f'encoder.{dst[7:]}': item for dst, item in mapped.items()
              if dst.startswith('visual.') and dst != 'visual.proj.kernel'}
  else:
    state_dict = _canonical_videomae(state_dict)
    sizes = videomae_config_from_state_dict(state_dict)
    kwargs = dict(backbone='videomae', **{
        key: sizes[key] for key in ('width', 'depth', 'heads', 'mlp_dim',
                                    'tubelet', 'patch_size')})
    mapped, unexpected = _rename(state_dict, _videomae_names())
    mapped = {dst: item for dst, item in mapped.items()  # decoder dropped
              if dst.startswith(('encoder.', 'head.'))}
  head = mapped.get('head.kernel')
  if head is not None and head[0].shape[0] != num_classes:
    logging.info('checkpoint head has %d classes, not %d: starting it fresh',
                 head[0].shape[0], num_classes)
    mapped = {k: v for k, v in mapped.items() if not k.startswith('head.')}
  kwargs.update(num_classes=num_classes, **overrides)
  return _assemble(lambda: Classifier(**kwargs, rngs=rngs or nnx.Rngs(0)),
                   mapped, unexpected=unexpected,
                   optional=('head.', 'encoder.temporal_pos'),
                   source='checkpoint')


def load_clip(path: str, **kwargs) -> CLIP:
  """`clip_from_state_dict(load_state_dict(path), **kwargs)`."""
  return clip_from_state_dict(load_state_dict(path), **kwargs)


def load_videomae(path: str, **kwargs) -> VideoMAE:
  """`videomae_from_state_dict(load_state_dict(path), **kwargs)`."""
  return videomae_from_state_dict(load_state_dict(path), **kwargs)


def load_classifier(path: str, **kwargs) -> Classifier:
  """`classifier_from_state_dict(load_state_dict(path), **kwargs)`."""
  return classifier_from_state_dict(load_state_dict(path), **kwargs)
