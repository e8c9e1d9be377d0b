"""Reading foreign checkpoint files and adapting their tensors to our layouts.

Files (.pt/.pth/.bin/.ckpt through torch, .safetensors and .npz without it)
become {name: numpy array}. PyTorch pickles are read with
`weights_only=True` (no code runs; argparse.Namespace, which AVION and
LaViLa store as `args`, is allowed); TorchScript archives, such as OpenAI's
released CLIP `.pt` files, are read as TorchScript. Conv patch embeddings
become tubelet kernels, and positional tables are resized.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import zipfile

import jax
import ml_dtypes
import numpy as np

TORCH_SUFFIXES = ('.pt', '.pth', '.bin', '.ckpt')


def to_numpy(value) -> np.ndarray:
  """numpy or torch (any float dtype, bf16 included) -> numpy; floats as f32."""
  if type(value).__module__.startswith('torch'):
    value = value.detach().cpu()
    value = (value.float() if value.is_floating_point() else value).numpy()
  array = np.asarray(value)
  if array.dtype.kind == 'f' or array.dtype == ml_dtypes.bfloat16:
    array = array.astype(np.float32, copy=False)
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


def is_torchscript(path: str) -> bool:
  """Whether `path` is a TorchScript archive (a zip with code/ and constants)."""
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as archive:
    return any(name.endswith('/constants.pkl') or '/code/' in name
               for name in archive.namelist())


def _read_torch(path: str, allow_pickle: bool):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f'reading {path} needs PyTorch (pip install torch); '
                      'or convert it to .safetensors or .npz') from e
  if is_torchscript(path):  # TorchScript code runs in its own interpreter.
    return torch.jit.load(path, map_location='cpu').state_dict()
  if allow_pickle:
    return torch.load(path, map_location='cpu', weights_only=False)
  try:
    with torch.serialization.safe_globals([argparse.Namespace]):
      return torch.load(path, map_location='cpu', weights_only=True)
  except pickle.UnpicklingError as e:
    named = re.search(r'GLOBAL (\S+)', str(e))
    reason = f'it names {named.group(1)}' if named else 'not only tensors'
    raise ValueError(
        f'{path}: a pickle that would run code to load ({reason}). If you '
        'trust the file, allow it with --config.init_allow_pickle=True '
        '(load_state_dict(..., allow_pickle=True))') from None


def load_state_dict(path: str, *, allow_pickle: bool = False
                    ) -> dict[str, np.ndarray]:
  """Reads a checkpoint file into {name: float32/int numpy array}.

  Args:
    path: .pt/.pth/.bin/.ckpt (needs torch: a TorchScript archive, or a
      pickle read with weights_only=True), .safetensors, or .npz. Wrappers
      such as {'model': ...}, {'state_dict': ...} or {'module': ...}, DDP's
      'module.' prefix and entries that are not tensors (AVION's `args`,
      `epoch`) are removed.
    allow_pickle: read PyTorch pickles with weights_only=False, which runs
      whatever code the file names: only for files you trust.

  Returns:
    The state dict.

  Raises:
    FileNotFoundError, ValueError: naming the file and the problem.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such file')
  suffix = os.path.splitext(path)[1].lower()
  if suffix == '.safetensors':
    raw = read_safetensors(path)
  elif suffix == '.npz':
    with np.load(path) as npz:
      raw = dict(npz)
  elif suffix in TORCH_SUFFIXES:
    raw = _read_torch(path, allow_pickle)
  else:
    raise ValueError(f'{path}: unknown checkpoint format {suffix!r} (expected '
                     f"{', '.join(TORCH_SUFFIXES)}, .safetensors or .npz)")
  for wrapper in ('state_dict', 'model', 'module'):
    if isinstance(raw, dict) and isinstance(raw.get(wrapper), dict):
      raw = raw[wrapper]
      break
  state_dict = {name.removeprefix('module.'): to_numpy(value)
                for name, value in raw.items()
                if hasattr(value, 'shape') and hasattr(value, 'dtype')}
  if not state_dict:
    raise ValueError(f'{path}: no tensors found')
  return state_dict


def conv_to_kernel(weight: np.ndarray) -> np.ndarray:
  """PyTorch conv weight [D, C, (t,) p, p] -> our [t*p*p*C, D] patch kernel.

  Rows are ordered (t, p, p, C), the order `vit.patchify` gives.
  """
  if weight.ndim == 4:
    weight = weight[:, :, None]
  return weight.transpose(2, 3, 4, 1, 0).reshape(-1, weight.shape[0])


def inflate_kernel(kernel: np.ndarray, tubelet: int,
                   mode: str = 'center') -> np.ndarray:
  """A one-frame patch kernel [p*p*C, D] -> a tubelet one [t*p*p*C, D].

  Args:
    kernel: from `conv_to_kernel` of a 2-D conv.
    tubelet: t.
    mode: 'center' puts the 2-D kernel at the central frame (zeros elsewhere,
      so a static video gives the image features); 'average' repeats it / t.

  Returns:
    [t*p*p*C, D].
  """
  if mode == 'average':
    return np.concatenate([kernel / tubelet] * tubelet)
  if mode != 'center':
    raise ValueError(f"inflation mode must be 'center' or 'average', "
                     f'got {mode!r}')
  inflated = np.zeros((tubelet,) + kernel.shape, kernel.dtype)
  inflated[tubelet // 2] = kernel
  return inflated.reshape(-1, kernel.shape[1])


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
  """Resizes a [T, D] temporal table to [new_length, D] as AVION does.

  More frames: linear interpolation with half-pixel centres (AVION/LaViLa's
  `F.interpolate(..., mode='bilinear')`, e.g. 4 -> 16 frames). Fewer frames:
  the first `new_length` rows (AVION truncates).
  """
  if new_length <= table.shape[0]:
    return table[:new_length]
  return np.asarray(jax.image.resize(table, (new_length, table.shape[1]),
                                     method='linear'))
