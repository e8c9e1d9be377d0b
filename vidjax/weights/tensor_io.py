"""Reading foreign checkpoints: files, names and tensor layouts.

Files (.pt/.pth/.bin/.ckpt through torch, .safetensors and .npz without it)
become {name: numpy array}. Safetensors files are read by the format's own
library, whose reader checks the header against the file (offsets inside
the data, sizes that fit the shapes) before any tensor is read. PyTorch pickles are read with
`weights_only=True` (no code runs; argparse.Namespace, which AVION and
LaViLa store as `args`, is allowed); TorchScript archives, such as OpenAI's
released CLIP `.pt` files, are read as data without running their code or
needing torch (`torchscript.py`). Foreign layouts of a model (Hugging Face,
AVION) are renamed to one canonical layout per model: OpenAI's CLIP names,
the original VideoMAE names (`weights.py` maps those to ours). Conv patch
embeddings become tubelet kernels, and positional tables are resized.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import zipfile
import zlib

import jax
import ml_dtypes
import numpy as np
import safetensors

from vidjax.base import errors, internals
from vidjax.weights import torchscript

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def to_numpy(value) -> np.ndarray:
  """numpy or torch (any float dtype, bf16 included) -> numpy; floats as f32."""
  if type(value).__module__.startswith("torch"):
    value = value.detach().cpu()
    value = (value.float() if value.is_floating_point() else value).numpy()
  array = np.asarray(value)
  if array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16:
    array = array.astype(np.float32, copy=False)
  return array


def is_torchscript(path: str) -> bool:
  """Whether `path` is a TorchScript archive (a zip with code/ and constants)."""
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as archive:
    return any(
      name.endswith("/constants.pkl") or "/code/" in name
      for name in archive.namelist()
    )


def _read_torchscript(path: str, allow_pickle: bool) -> dict:
  """A TorchScript archive as data; run (torch.jit.load) only if allowed."""
  try:
    return torchscript.read(path)
  except torchscript.Refused as e:
    if not allow_pickle:
      raise errors.InitFromError(
        f"{path}: a TorchScript archive that needs its own code run to "
        f"load ({e}). If you trust the file, allow it with "
        "--config.init_allow_pickle=True (load_state_dict(..., "
        "allow_pickle=True))"
      ) from None
  import torch

  return torch.jit.load(path, map_location="cpu").state_dict()


def _read_torch(path: str, allow_pickle: bool):
  if is_torchscript(path):
    return _read_torchscript(path, allow_pickle)
  try:
    import torch
  except ImportError as e:
    raise errors.InitFromError(
      f"reading {path} needs PyTorch (pip install torch); "
      "or convert it to .safetensors or .npz"
    ) from e
  if allow_pickle:
    return torch.load(path, map_location="cpu", weights_only=False)
  try:
    with torch.serialization.safe_globals([argparse.Namespace]):
      return torch.load(path, map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    named = internals.refused_pickle_global(e)
    if not named:  # Not a class or function to import: a damaged pickle.
      raise
    raise errors.InitFromError(
      f"{path}: a pickle that would run code to load (it names "
      f"{named}). If you trust the file, allow it with "
      "--config.init_allow_pickle=True (load_state_dict(..., "
      "allow_pickle=True))"
    ) from None


# What reading a damaged or foreign file raises: the format's own parse errors
# (JSON, zip, zlib, pickle), torch's (RuntimeError from its zip reader) and
# a garbage pickle's (IndexError from an empty stack, EOFError, an
# AttributeError from BUILD on a plain value, ...).
_DAMAGED = (
  ValueError,
  KeyError,
  IndexError,
  TypeError,
  AssertionError,
  AttributeError,
  EOFError,
  OSError,
  RuntimeError,
  pickle.UnpicklingError,
  zipfile.BadZipFile,
  zlib.error,
  safetensors.SafetensorError,
)


def load_state_dict(
  path: str, *, allow_pickle: bool = False, extras: dict | None = None
) -> dict[str, np.ndarray]:
  """Reads a checkpoint file into {name: float32/int numpy array}.

  Args:
    path: .pt/.pth/.bin/.ckpt (a TorchScript archive, read as data; or a
      pickle, read by torch with weights_only=True), .safetensors, or .npz. Wrappers
      such as {'model': ...}, {'state_dict': ...} or {'module': ...}, DDP's
      'module.' prefix and entries that are not tensors (AVION's `args`,
      `epoch`) are removed.
    allow_pickle: read PyTorch pickles with weights_only=False, and
      TorchScript archives that need their own code to load with
      torch.jit.load; both run whatever code the file holds: only for files
      you trust.
    extras: if given, filled with what the file holds besides tensors: a
      safetensors header's metadata ({str: str}), a pickle's other entries
      (an `argparse.Namespace` such as AVION's `args` as a dict).

  Returns:
    The state dict.

  Raises:
    errors.PathError: no such file.
    errors.InitFromError: naming the file and the problem (an unknown
      format, a damaged file, no tensors).
  """
  if not os.path.isfile(path):
    raise errors.PathError(f"{path}: no such file")
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in TORCH_SUFFIXES + (".safetensors", ".npz"):
    raise errors.InitFromError(
      f"{path}: unknown checkpoint format {suffix!r} (expected "
      f"{', '.join(TORCH_SUFFIXES)}, .safetensors or .npz)"
    )
  try:
    if suffix == ".safetensors":  # bfloat16 as ml_dtypes.bfloat16.
      with safetensors.safe_open(path, framework="numpy") as f:
        raw = {name: f.get_tensor(name) for name in f.keys()}
        if extras is not None:
          extras.update(f.metadata() or {})
    elif suffix == ".npz":
      with np.load(path) as npz:  # A .npy has no `with`: a TypeError.
        raw = dict(npz)
    else:
      raw = _read_torch(path, allow_pickle)
  except errors.InitFromError:
    raise
  except _DAMAGED as e:
    raise errors.InitFromError(
      f"{path}: cannot be read as {suffix} ({internals.error_reason(e)}): the file is "
      "damaged (e.g. a partial download) or not in that format"
    ) from None
  if not isinstance(raw, dict):
    raise errors.InitFromError(
      f"{path}: holds a {type(raw).__name__}, not a dict of tensors"
    )
  for wrapper in ("state_dict", "model", "module"):
    if isinstance(raw.get(wrapper), dict):
      if extras is not None and suffix != ".safetensors":
        extras.update(
          (k, vars(v) if isinstance(v, argparse.Namespace) else v)
          for k, v in raw.items()
          if k != wrapper
        )
      raw = raw[wrapper]
      break
  state_dict = {
    name.removeprefix("module."): to_numpy(value)
    for name, value in raw.items()
    if hasattr(value, "shape") and hasattr(value, "dtype")
  }
  if not state_dict:
    raise errors.InitFromError(f"{path}: no tensors found")
  return state_dict


# ------------------------------------- foreign names -> canonical ones


def renamed(name: str, rules) -> str:
  """A foreign name -> the canonical one: each (old, new) rule in order, an
  infix ('.x.') replaced once, a prefix replaced at the start."""
  for old, new in rules:
    name = (
      name.replace(old, new, 1)
      if old.startswith(".")
      else (new + name[len(old) :] if name.startswith(old) else name)
    )
  return name


def foreign_name(name: str, rules, *, undo: bool = True) -> str:
  """A canonical name -> the foreign one that `rules` rename to it: the
  rules undone in reverse order (`undo`), or the name as it is (a part of
  a model kept in the canonical names). A rule that drops a prefix is not
  undone: the caller adds it. Checked: raises ValueError if the foreign
  name does not rename back to `name`."""
  foreign = name
  for old, new in reversed(rules if undo else ()):
    if new.startswith("."):
      foreign = foreign.replace(new, old, 1)
    elif new and foreign.startswith(new):
      foreign = old + foreign[len(new) :]
  if renamed(foreign, rules) != name:
    raise ValueError(f"{name}: no foreign name renames to it ({foreign})")
  return foreign


HF_CLIP = [  # transformers' CLIPModel -> OpenAI's names
  ("vision_model.embeddings.patch_embedding.", "visual.conv1."),
  ("vision_model.embeddings.class_embedding", "visual.class_embedding"),
  (
    "vision_model.embeddings.position_embedding.weight",
    "visual.positional_embedding",
  ),
  ("vision_model.pre_layrnorm.", "visual.ln_pre."),  # sic
  ("vision_model.post_layernorm.", "visual.ln_post."),
  ("vision_model.encoder.layers.", "visual.transformer.resblocks."),
  ("text_model.embeddings.token_embedding.", "token_embedding."),
  ("text_model.embeddings.position_embedding.weight", "positional_embedding"),
  ("text_model.encoder.layers.", "transformer.resblocks."),
  ("text_model.final_layer_norm.", "ln_final."),
  (".self_attn.out_proj.", ".attn.out_proj."),
  (".layer_norm1.", ".ln_1."),
  (".layer_norm2.", ".ln_2."),
  (".mlp.fc1.", ".mlp.c_fc."),
  (".mlp.fc2.", ".mlp.c_proj."),
]
AVION_CLIP = [  # AVION's CLIP_VITB16 / VideoClassifier -> OpenAI's names
  ("textual.text_projection", "text_projection"),
  ("textual.", ""),
  ("visual.image_projection", "visual.proj"),
  (".attn.Wqkv.weight", ".attn.in_proj_weight"),
  (".attn.Wqkv.bias", ".attn.in_proj_bias"),
  (".mlp.fc1.", ".mlp.c_fc."),
  (".mlp.fc2.", ".mlp.c_proj."),
  ("fc_cls.", "head."),
]
# Not parameters: OpenAI's TorchScript extras, Hugging Face's position ids.
CLIP_EXTRAS = (
  "input_resolution",
  "context_length",
  "vocab_size",
  "vision_model.embeddings.position_ids",
  "text_model.embeddings.position_ids",
)


def canonical_clip(sd: dict) -> tuple[dict, str]:
  """Any CLIP layout -> OpenAI's names and shapes; also names the format."""
  sd = {k: v for k, v in sd.items() if k not in CLIP_EXTRAS}
  if "vision_model.embeddings.patch_embedding.weight" in sd:
    out = {}
    for name, value in sd.items():
      stem, _, leaf = name.rpartition(".self_attn.")
      if leaf.startswith(("q_proj.", "k_proj.", "v_proj.")):
        if leaf.startswith("q_proj."):
          kind = leaf.split(".")[1]
          parts = [sd[f"{stem}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
          out[renamed(f"{stem}.attn.in_proj_{kind}", HF_CLIP)] = np.concatenate(
            parts
          )
      elif name == "visual_projection.weight":  # Linear: [E, D]
        out["visual.proj"] = value.T
      elif name == "text_projection.weight":
        out["text_projection"] = value.T
      else:
        out[renamed(name, HF_CLIP)] = value
    return out, "Hugging Face CLIP"
  avion = any(
    k.startswith(("textual.", "fc_cls.", "visual.image_projection"))
    or ".attn.Wqkv." in k
    for k in sd
  )
  if not avion:
    return sd, "OpenAI/OpenCLIP CLIP"
  out = {renamed(name, AVION_CLIP): value for name, value in sd.items()}
  conv = out.get("visual.conv1.weight")
  if conv is not None and conv.ndim == 2:  # --use-fast-conv1: (c, y, x)
    patch = math.isqrt(conv.shape[1] // 3)
    out["visual.conv1.weight"] = conv.reshape(conv.shape[0], 3, patch, patch)
  kind = "video classifier" if "head.weight" in out else "CLIP"
  return out, f"AVION {kind}"


HF_VIDEOMAE = [  # transformers' VideoMAE classes -> the original names
  (
    "videomae.embeddings.patch_embeddings.projection.",
    "encoder.patch_embed.proj.",
  ),
  ("videomae.encoder.layer.", "encoder.blocks."),
  ("decoder.decoder_layers.", "decoder.blocks."),
  ("videomae.layernorm.", "encoder.norm."),
  ("fc_norm.", "encoder.fc_norm."),
  ("classifier.", "encoder.head."),
  # in order: 'attention.output.dense' before 'output.dense'
  (".attention.attention.", ".attn."),
  (".attention.output.dense.", ".attn.proj."),
  (".layernorm_before.", ".norm1."),
  (".layernorm_after.", ".norm2."),
  (".intermediate.dense.", ".mlp.fc1."),
  (".output.dense.", ".mlp.fc2."),
]
AVION_VIDEOMAE = [  # AVION's flash-attention blocks -> the original names
  (".attn.Wqkv.", ".attn.qkv."),
  (".attn.out_proj.", ".attn.proj."),
]


def canonical_videomae(sd: dict) -> tuple[dict, str]:
  """Hugging Face, fine-tuned or AVION VideoMAE names -> the original's.

  The original release names the encoder 'encoder.blocks.<i>.attn.qkv' with
  separate 'q_bias'/'v_bias' (keys have no bias); fine-tuned checkpoints drop
  the 'encoder.' prefix; Hugging Face splits query/key/value (and its
  VideoMAEModel, saved alone, has no 'videomae.' prefix); AVION's
  flash-attention blocks have `attn.Wqkv` (one bias) and `attn.out_proj`,
  and `--channel-last` stores the patch embedding as a Linear over
  (channel, frame, row, column).
  """
  if any(name.startswith("embeddings.patch_embeddings.") for name in sd):
    # A VideoMAEModel's own save_pretrained: its names without 'videomae.'.
    sd = {f"videomae.{name}": value for name, value in sd.items()}
  is_hf = any(name.startswith("videomae.") for name in sd)
  is_finetuned = "patch_embed.proj.weight" in sd
  is_avion = any(".attn.Wqkv." in name for name in sd)
  named = {}
  for name, value in sd.items():
    if is_hf:
      name = renamed(name, HF_VIDEOMAE)
    elif is_finetuned:
      name = f"encoder.{name}"
    named[renamed(name, AVION_VIDEOMAE)] = value
  out = {}
  for name, value in named.items():
    stem, _, leaf = name.rpartition(".attn.")
    if leaf == "query.weight":
      out[f"{stem}.attn.qkv.weight"] = np.concatenate(
        [
          value,
          named[f"{stem}.attn.key.weight"],
          named[f"{stem}.attn.value.weight"],
        ]
      )
    elif leaf in ("key.weight", "value.weight"):
      continue
    elif leaf == "q_bias":
      out[f"{stem}.attn.qkv.bias"] = np.concatenate(
        [value, np.zeros_like(value), named[f"{stem}.attn.v_bias"]]
      )
    elif leaf != "v_bias":
      out[name] = value
  for name in list(out):  # blocks trained without QKV bias: zeros are exact
    if name.endswith(".attn.qkv.weight"):
      out.setdefault(
        name.replace(".weight", ".bias"),
        np.zeros(out[name].shape[0], np.float32),
      )
  conv = out.get("encoder.patch_embed.proj.weight")
  if conv is not None and conv.ndim == 2:
    # The Linear does not say its tubelet: VideoMAE's is 2 (AVION's only
    # setting); otherwise the first that leaves a square patch.
    tubelet = next(
      t
      for t in (2, 1, 4, 3)
      if conv.shape[1] % (3 * t) == 0
      and math.isqrt(conv.shape[1] // (3 * t)) ** 2 * 3 * t == conv.shape[1]
    )
    patch = math.isqrt(conv.shape[1] // (3 * tubelet))
    out["encoder.patch_embed.proj.weight"] = conv.reshape(
      conv.shape[0], 3, tubelet, patch, patch
    )
  fmt = "Hugging Face" if is_hf else "AVION" if is_avion else "original"
  return out, f"VideoMAE ({fmt})"


# ------------------------------------------------------ tensor layouts


def conv_to_kernel(weight: np.ndarray) -> np.ndarray:
  """PyTorch conv weight [D, C, (t,) p, p] -> our [t*p*p*C, D] patch kernel.

  Rows are ordered (t, p, p, C), the order `vit.patchify` gives.
  """
  if weight.ndim == 4:
    weight = weight[:, :, None]
  return weight.transpose(2, 3, 4, 1, 0).reshape(-1, weight.shape[0])


def kernel_to_conv(
  kernel: np.ndarray, *, tubelet: int, channels: int = 3
) -> np.ndarray:
  """Our patch kernel [t*p*p*C, D] -> a PyTorch conv weight: [D, C, p, p]
  for t = 1 (Conv2d), else [D, C, t, p, p] (Conv3d); `conv_to_kernel`'s
  inverse."""
  patch = math.isqrt(kernel.shape[0] // (tubelet * channels))
  weight = kernel.reshape(tubelet, patch, patch, channels, -1)
  weight = weight.transpose(4, 3, 0, 1, 2)
  return weight[:, :, 0] if tubelet == 1 else weight


def inflate_kernel(
  kernel: np.ndarray, tubelet: int, mode: str = "center"
) -> np.ndarray:
  """A one-frame patch kernel [p*p*C, D] -> a tubelet one [t*p*p*C, D].

  Args:
    kernel: from `conv_to_kernel` of a 2-D conv.
    tubelet: t.
    mode: 'center' puts the 2-D kernel at the central frame (zeros elsewhere,
      so a static video gives the image features); 'average' repeats it / t.

  Returns:
    [t*p*p*C, D].
  """
  if mode == "average":
    return np.concatenate([kernel / tubelet] * tubelet)
  if mode != "center":
    raise ValueError(
      f"inflation mode must be 'center' or 'average', got {mode!r}"
    )
  inflated = np.zeros((tubelet,) + kernel.shape, kernel.dtype)
  inflated[tubelet // 2] = kernel
  return inflated.reshape(-1, kernel.shape[1])


def interpolate_pos_embed(
  table: np.ndarray, new_length: int, num_prefix: int = 1
) -> np.ndarray:
  """Resizes a [prefix + g*g, D] positional table to [new_length, D].

  The first `num_prefix` rows (class token) are kept; the square grid is
  resized bicubically to sqrt(new_length - num_prefix) per side.
  """
  if table.shape[0] == new_length:
    return table
  old_side = math.isqrt(table.shape[0] - num_prefix)
  new_side = math.isqrt(new_length - num_prefix)
  if (
    old_side**2 + num_prefix != table.shape[0]
    or new_side**2 + num_prefix != new_length
  ):
    raise ValueError(
      f"cannot interpolate a positional table of "
      f"{table.shape[0]} rows to {new_length}: not a square "
      f"grid plus {num_prefix} prefix rows"
    )
  grid = table[num_prefix:].reshape(old_side, old_side, -1)
  resized = jax.image.resize(
    grid, (new_side, new_side, grid.shape[-1]), method="bicubic"
  )
  return np.concatenate(
    [table[:num_prefix], np.asarray(resized).reshape(new_side**2, -1)]
  )


def interpolate_temporal(table: np.ndarray, new_length: int) -> np.ndarray:
  """Resizes a [T, D] temporal table to [new_length, D] as AVION does.

  More frames: linear interpolation with half-pixel centres (AVION/LaViLa's
  `F.interpolate(..., mode='bilinear')`, e.g. 4 -> 16 frames). Fewer frames:
  the first `new_length` rows (AVION truncates).
  """
  if new_length <= table.shape[0]:
    return table[:new_length]
  return np.asarray(
    jax.image.resize(table, (new_length, table.shape[1]), method="linear")
  )
