"""Reading foreign checkpoints and adapting their tensors to our layouts.

Used by weights.py: files (.pt/.pth/.bin through torch, .safetensors and
.npz without it) become {name: numpy array}; PyTorch conv patch embeddings
become tubelet kernels; positional tables are resized.
"""
from __future__ import annotations

import json
import math
import os

import jax
import ml_dtypes
import numpy as np

def to_numpy(value) -> np.ndarray:
  """numpy or torch (any float dtype, bf16 included) -> numpy; floats as f32."""
  if type(value).__module__.startswith('torch'):
    value = value.detach().cpu()
    value = (value.float() if value.is_floating_point() else value).numpy()
  array = np.asarray(value)
  if array.dtype.kind == 'f' or array.dtype == ml_dtypes.bfloat16:
    array = array.astype(np.float32)
  return array


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Reads a .safetensors file (an 8-byte header size, a JSON header, data)."""
  dtypes = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
            'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
            'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}
  with open(path, 'rb') as f:
    header_size = int.from_bytes(f.read(8), 'little')
    header = json.loads(f.read(header_size))
    data = f.read()
  tensors = {}
  for name, info in header.items():
    if name == '__metadata__':
      continue
    if info['dtype'] not in dtypes:
      raise ValueError(f'{path}: tensor {name!r} has unsupported dtype '
                       f"{info['dtype']}")
    start, end = info['data_offsets']
    tensors[name] = np.frombuffer(data[start:end], dtypes[info['dtype']]
                                  ).reshape(info['shape'])
  return tensors


def load_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads a checkpoint file into {name: float32/int numpy array}.

  Args:
    path: .pt/.pth/.bin (needs torch; loaded with weights_only=True),
      .safetensors, or .npz. Wrappers such as {'model': ...},
      {'state_dict': ...} or {'module': ...} and DDP's 'module.' prefix are
      removed.

  Returns:
    The state dict.
  """
  suffix = os.path.splitext(path)[1].lower()
  if suffix == '.safetensors':
    raw = read_safetensors(path)
  elif suffix == '.npz':
    with np.load(path) as npz:
      raw = dict(npz)
  elif suffix in ('.pt', '.pth', '.bin', '.ckpt'):
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(f'reading {path} needs PyTorch (pip install torch); '
                        'or convert it to .safetensors or .npz') from e
    raw = torch.load(path, map_location='cpu', weights_only=True)
  else:
    raise ValueError(f'{path}: unknown checkpoint format {suffix!r} (expected '
                     '.pt, .pth, .bin, .safetensors or .npz)')
  for wrapper in ('state_dict', 'model', 'module'):
    if isinstance(raw.get(wrapper), dict):
      raw = raw[wrapper]
      break
  state_dict = {name.removeprefix('module.'): to_numpy(value)
                for name, value in raw.items()}
  if not state_dict:
    raise ValueError(f'{path}: no tensors found')
  return state_dict


def inflate_patch_embed(weight: np.ndarray, tubelet: int,
                        mode: str = 'center') -> np.ndarray:
  """A 2-D patch embedding [D, C, p, p] -> a tubelet one [D, C, t, p, p].

  Args:
    weight: [D, C, p, p], or already [D, C, t, p, p] (returned unchanged).
    tubelet: t.
    mode: 'center' puts the 2-D kernel at the central frame (zeros elsewhere,
      so a static video gives the image features); 'average' repeats it / t.

  Returns:
    [D, C, t, p, p].
  """
  if weight.ndim == 5:
    return weight
  if mode == 'average':
    return np.repeat(weight[:, :, None], tubelet, axis=2) / tubelet
  if mode != 'center':
    raise ValueError(f"inflation mode must be 'center' or 'average', "
                     f'got {mode!r}')
  inflated = np.zeros(weight.shape[:2] + (tubelet,) + weight.shape[2:],
                      weight.dtype)
  inflated[:, :, tubelet // 2] = weight
  return inflated


def conv_to_kernel(weight: np.ndarray) -> np.ndarray:
  """PyTorch conv weight [D, C, t, p, p] -> our [t*p*p*C, D] patch kernel."""
  return weight.transpose(2, 3, 4, 1, 0).reshape(-1, weight.shape[0])


def interpolate_pos_embed(table: np.ndarray, new_length: int,
                          num_prefix: int = 1) -> np.ndarray:
  """Resizes a [prefix + g*g, D] positional table to [new_length, D].

  The first `num_prefix` rows (class token) are kept; the square grid is
  resized bicubically to sqrt(new_length - num_prefix) per side.
  """
  if table.shape[0] == new_length:
    return table
  old_side = math.isqrt(table.shape[0] - num_prefix)
  new_side = math.isqrt(new_length - num_prefix)
  if (old_side**2 + num_prefix != table.shape[0]
      or new_side**2 + num_prefix != new_length):
    raise ValueError(f'cannot interpolate a positional table of '
                     f'{table.shape[0]} rows to {new_length}: not a square '
                     f'grid plus {num_prefix} prefix rows')
  grid = table[num_prefix:].reshape(old_side, old_side, -1)
  resized = jax.image.resize(grid, (new_side, new_side, grid.shape[-1]),
                             method='bicubic')
  return np.concatenate([table[:num_prefix],
                         np.asarray(resized).reshape(new_side**2, -1)])


def interpolate_temporal(table: np.ndarray, new_length: int) -> np.ndarray:
  """Linearly resizes a [T, D] temporal table to [new_length, D]."""
  if table.shape[0] == new_length:
    return table
  return np.asarray(jax.image.resize(table, (new_length, table.shape[1]),
                                     method='linear'))
