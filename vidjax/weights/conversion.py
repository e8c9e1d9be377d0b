"""Weight import: released checkpoints' state dicts as `init_from.Source`s.

Every format is mapped to our parameter paths (foreign layouts first become
OpenAI's CLIP or the original VideoMAE names in `tensor_io`):

* CLIP: OpenAI (the TorchScript `.pt` releases) and OpenCLIP (`.pt`, `.bin`,
  `.safetensors`); Hugging Face `CLIPModel` (split q/k/v); AVION's CLIP
  (`visual.*` / `textual.*`, flash-attention `attn.Wqkv` and `mlp.fc1/fc2`,
  `visual.image_projection`, `--use-fast-conv1` patch embedding stored as
  a Linear over (channel, row, column)) and its video classifier (`fc_cls`).
* VideoMAE: the original pretraining and fine-tuned checkpoints, Hugging
  Face's, and AVION's (flash-attention names, `--channel-last` Linear
  patch embedding).

Layouts become ours (PyTorch Linear weights transposed, conv patch
embeddings flattened to patch kernels); resizing to the configured model is
`init_from.fill`'s; `sources.py` reads what a path names (files, Hugging
Face `save_pretrained` directories, vidjax runs). Each source also says what it computed with (`facts`:
activation, LayerNorm eps, pooling, temperature). `*_from_state_dict` build
a model sized from the weights, computing what they computed.
"""

from __future__ import annotations

import math
import os
import re

from flax import nnx
import numpy as np

from vidjax.base import errors
from vidjax.config import defaults
from vidjax.models import spec as spec_lib
from vidjax.models.clip import CLIP
from vidjax.models.videomae import Classifier, VideoMAE
from vidjax.weights import facts as facts_lib, init_from
from vidjax.weights.tensor_io import (
  canonical_clip,
  canonical_videomae,
  conv_to_kernel,
  to_numpy,
)

__all__ = [
  "classifier_from_state_dict",
  "clip_from_state_dict",
  "convert",
  "videomae_from_state_dict",
]

# ------------------------------------------------ canonical names -> ours


def _t(x):
  return x.T


def _linear(src: str, dst: str):
  """PyTorch Linear `src` -> our nnx.Linear `dst` (kernel transposed)."""
  return {
    f"{src}.weight": (f"{dst}.kernel", _t),
    f"{src}.bias": (f"{dst}.bias", None),
  }


def _norm(src: str, dst: str):
  return {
    f"{src}.weight": (f"{dst}.scale", None),
    f"{src}.bias": (f"{dst}.bias", None),
  }


CLIP_BLOCK = {
  **_norm("ln_1", "norm1"),
  **_norm("ln_2", "norm2"),
  "attn.in_proj_weight": ("attn.qkv.kernel", _t),
  "attn.in_proj_bias": ("attn.qkv.bias", None),
  **_linear("attn.out_proj", "attn.out"),
  **_linear("mlp.c_fc", "mlp.fc1"),
  **_linear("mlp.c_proj", "mlp.fc2"),
}
VIDEOMAE_BLOCK = {
  **_norm("norm1", "norm1"),
  **_norm("norm2", "norm2"),
  **_linear("attn.qkv", "attn.qkv"),
  **_linear("attn.proj", "attn.out"),
  **_linear("mlp.fc1", "mlp.fc1"),
  **_linear("mlp.fc2", "mlp.fc2"),
}
# OpenAI CLIP names -> our CLIP's (AVION's classifier: `head` from fc_cls).
CLIP_NAMES = (
  {
    "visual.conv1.weight": ("visual.patch_embed.kernel", conv_to_kernel),
    "visual.class_embedding": ("visual.class_token", None),
    "visual.positional_embedding": ("visual.spatial_pos", None),
    # Video CLIPs (AVION) add a temporal table [T, D]; image CLIPs do not.
    "visual.temporal_embedding": ("visual.temporal_pos", None),
    **_norm("visual.ln_pre", "visual.pre_norm"),
    **_norm("visual.ln_post", "visual.norm"),
    "visual.proj": ("visual.proj.kernel", None),
    "token_embedding.weight": ("text.token_embed.embedding", None),
    "positional_embedding": ("text.pos_embed", None),
    **_norm("ln_final", "text.norm"),
    "text_projection": ("text.proj.kernel", None),
    "logit_scale": ("logit_scale", None),
    **_linear("head", "head"),
  },
  [
    (
      r"visual\.transformer\.resblocks\.(\d+)\.",
      "visual.blocks.layers",
      CLIP_BLOCK,
    ),
    (r"transformer\.resblocks\.(\d+)\.", "text.blocks.layers", CLIP_BLOCK),
  ],
  "CLIP",
)
# Original VideoMAE names ('encoder.' prefixed) -> ours.
VIDEOMAE_NAMES = (
  {
    "encoder.patch_embed.proj.weight": (
      "encoder.patch_embed.kernel",
      conv_to_kernel,
    ),
    "encoder.patch_embed.proj.bias": ("encoder.patch_embed.bias", None),
    **_norm("encoder.norm", "encoder.norm"),
    **_norm("encoder.fc_norm", "encoder.norm"),  # fine-tuned: mean pooling
    **_linear("encoder.head", "head"),
    "encoder_to_decoder.weight": ("encoder_to_decoder.kernel", _t),
    "mask_token": ("mask_token", np.ravel),
    **_norm("decoder.norm", "decoder_norm"),
    **_linear("decoder.head", "decoder_head"),
  },
  [
    (r"encoder\.blocks\.(\d+)\.", "encoder.blocks.layers", VIDEOMAE_BLOCK),
    (r"decoder\.blocks\.(\d+)\.", "decoder.layers", VIDEOMAE_BLOCK),
  ],
  "VideoMAE",
)


def _rename(state_dict: dict, names, where: str) -> tuple[dict, dict, list]:
  """-> ({our path: array}, {our path: source name}, unmatched names)."""
  top, blocks, _ = names
  tensors, sources, unmatched = {}, {}, []
  for name, value in state_dict.items():
    if name in top:
      dst, transform = top[name]
    else:
      for pattern, prefix, table in blocks:
        match = re.match(pattern, name)
        if match and name[match.end() :] in table:
          dst, transform = table[name[match.end() :]]
          dst = f"{prefix}.{match.group(1)}.{dst}"
          break
      else:
        unmatched.append(name)
        continue
    if dst in tensors:  # e.g. both a norm and an fc_norm
      unmatched.append(name)
      continue
    try:
      tensors[dst] = transform(value) if transform else value
    except (ValueError, IndexError):  # Another rank than its layout's.
      raise errors.InitFromError(
        f"{where}: the tensor {name} has shape {tuple(np.shape(value))}, "
        f"which is not the layout of {name} in a {names[2]} state dict",
        hint="the file is damaged or of another model: check it, or name "
        "another one in --config.init_from",
      ) from None
    sources[dst] = name
  return tensors, sources, unmatched


# ------------------------------------------------------------------ sources


def convert(
  state_dict: dict,
  description: str = "state dict",
  *,
  hf_config: dict | None = None,
) -> init_from.Source:
  """A state dict of any supported format -> an `init_from.Source`.

  Args:
    state_dict: name -> numpy array or torch tensor.
    description: where it came from, for messages (e.g. the file path).
    hf_config: the config.json of a Hugging Face directory (`description`
      is then the directory).

  Raises:
    errors.InitFromError: a format we do not read, named.
  """
  sd = {name: to_numpy(value) for name, value in state_dict.items()}
  where = os.path.join(description, "config.json")  # For hf_config.
  if any(".timeattn." in name for name in sd):
    raise errors.InitFromError(
      f"{description}: a TimeSformer (divided space-time attention, as in "
      "LaViLa's own models); vidjax's video ViT uses joint attention, so "
      "these weights do not apply. Use AVION's checkpoints or a CLIP"
    )
  if any(
    k.startswith(("visual.conv1.", "vision_model.", "textual.")) for k in sd
  ):
    released = "input_resolution" in sd  # OpenAI's .pt archives' extras
    sd, fmt = canonical_clip(sd)
    tensors, names, unexpected = _rename(sd, CLIP_NAMES, description)
    kind = "classifier" if "head.kernel" in tensors else "clip"
    if kind == "classifier":
      tensors = {
        re.sub(r"^visual\.", "encoder.", k): v for k, v in tensors.items()
      }
      names = {re.sub(r"^visual\.", "encoder.", k): v for k, v in names.items()}
    origin = (
      "hugging_face"
      if fmt.startswith("Hugging Face")
      else "avion"
      if fmt.startswith("AVION")
      else "openai"
      if released
      else "openclip"
    )
    if origin == "openai":
      fmt = "OpenAI CLIP"
    temperature = tensors.get("logit_scale") if origin == "avion" else None
    facts = facts_lib.clip_facts(
      origin,
      hf_config=hf_config,
      where=where,
      temperature=None if temperature is None else float(temperature),
    )
    return init_from.Source(
      kind,
      tensors,
      names,
      f"{description} ({fmt})",
      unexpected,
      tubelet=1,
      backbone="clip",
      facts=facts,
    )
  if any(
    k.startswith(
      (
        "encoder.patch_embed.",
        "patch_embed.",
        "videomae.",
        "embeddings.patch_embeddings.",
      )
    )
    for k in sd
  ):
    sd, fmt = canonical_videomae(sd)
    tensors, names, unexpected = _rename(sd, VIDEOMAE_NAMES, description)
    finetuned = any(
      k.startswith(("encoder.head.", "encoder.fc_norm.")) for k in sd
    )
    hugging_face = "Hugging Face" in fmt
    facts = facts_lib.videomae_facts(
      "hugging_face" if hugging_face else "original",
      finetuned=finetuned,
      # A Hugging Face encoder has its last LayerNorm exactly when its
      # config says use_mean_pooling=False (VideoMAEModel.layernorm).
      mean_pooling="encoder.fc_norm.weight" in sd
      or (hugging_face and not finetuned and "encoder.norm.weight" not in sd),
      hf_config=hf_config,
      where=where,
      decoder="encoder_to_decoder.weight" in sd,
    )
    conv = sd.get("encoder.patch_embed.proj.weight")
    return init_from.Source(
      "classifier" if finetuned else "videomae",
      tensors,
      names,
      f"{description} ({fmt})",
      unexpected,
      tubelet=conv.shape[2] if conv is not None else None,
      backbone="videomae",
      facts=facts,
    )
  raise errors.InitFromError(
    f"{description}: not a CLIP or VideoMAE checkpoint "
    f"we know (first names: {list(sd)[:5]})"
  )


# ----------------------------------------------------- standalone builders


def _count(tensors: dict, prefix: str) -> int:
  pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
  return len({m.group(1) for m in map(pattern.match, tensors) if m})


def _require(source: init_from.Source, path: str, kind: str) -> np.ndarray:
  if path not in source.tensors:
    raise errors.InitFromError(
      f"not a {kind} state dict: {source.description} has no "
      f"{path!r} (first names: {list(source.names.values())[:5]})"
    )
  return source.tensors[path]


def _vision_sizes(source: init_from.Source, prefix: str, kind: str) -> dict:
  """ViT sizes from a tower's tensors (heads = width / 64, as CLIP's)."""
  kernel = _require(source, f"{prefix}.patch_embed.kernel", kind)
  tubelet = source.tubelet or 1
  patch = math.isqrt(kernel.shape[0] // (3 * tubelet))
  sizes = dict(
    width=kernel.shape[1],
    heads=kernel.shape[1] // 64,
    depth=_count(source.tensors, f"{prefix}.blocks.layers"),
    mlp_dim=_require(
      source, f"{prefix}.blocks.layers.0.mlp.fc1.kernel", kind
    ).shape[1],
    patch_size=patch,
    tubelet=tubelet,
  )
  if f"{prefix}.spatial_pos" in source.tensors:
    rows = source.tensors[f"{prefix}.spatial_pos"].shape[0]
    sizes["image_size"] = math.isqrt(rows - 1) * patch
  return sizes


def _fact_keys(source: init_from.Source, kind: str) -> dict:
  """`config.model` keys for what the source computed with (its facts)."""
  keys = ["act", "ln_eps"]
  if kind == "clip":
    keys.append("text.ln_eps")
  elif kind == "videomae":
    keys.append("decoder.ln_eps")
  elif kind == "classifier":
    keys += ["head_ln_eps", "pool"]
  return {key: source.facts[key][0] for key in keys if key in source.facts}


def _spec(kind: str, sizes: dict, *keys: dict):
  """The spec of the `kind` model of `config.model` keys (dotted names, the
  later dicts winning) from a state dict's `sizes` (`_vision_sizes`), on
  `defaults.model_config(kind)` in float32 without drop path."""
  config = defaults.model_config(kind)
  config.update(dtype="float32", drop_path=0.0)
  sizes = dict(sizes)
  # The variant only names the patch: its sizes are the state dict's.
  config.variant = f"B/{sizes.pop('patch_size')}"
  for flat in (sizes, *keys):
    config.update_from_flattened_dict(flat)
  return spec_lib.from_config(config)


def _clip_config(source: init_from.Source) -> dict:
  vision = _vision_sizes(source, "visual", "CLIP")
  embed = _require(source, "text.token_embed.embedding", "CLIP")
  config = {
    **{k: v for k, v in vision.items() if k != "tubelet"},
    "embed_dim": _require(source, "text.proj.kernel", "CLIP").shape[1],
    "text.vocab_size": embed.shape[0],
    "text.context_length": _require(source, "text.pos_embed", "CLIP").shape[0],
    "text.width": embed.shape[1],
    "text.heads": embed.shape[1] // 64,
    "text.layers": _count(source.tensors, "text.blocks.layers"),
  }
  if "logit_scale" in source.tensors:
    config["logit_scale_init"] = float(source.tensors["logit_scale"])
  return config


def clip_from_state_dict(
  state_dict: dict,
  *,
  num_frames: int = 1,
  patch_inflation: str = "center",
  rngs: nnx.Rngs | None = None,
  keep_init: tuple[str, ...] = (),
  **overrides,
) -> CLIP:
  """A video-text CLIP from a CLIP state dict (any format `convert` reads).

  Args:
    state_dict: names such as 'visual.transformer.resblocks.0.attn.
      in_proj_weight' -> numpy arrays or torch tensors.
    num_frames: frames per clip; the temporal embedding starts at zero
      unless the state dict has 'visual.temporal_embedding' (resized).
    patch_inflation: 'center' or 'average', when `tubelet` > 1.
    rngs: for the few variables not loaded (default nnx.Rngs(0)).
    keep_init: model parameter prefixes (e.g. 'text.') left at their
      initial values even where the state dict's fit (projections to
      another `embed_dim` start fresh anyway).
    **overrides: `config.model` keys, e.g. act='gelu' for OpenCLIP
      models trained with GELU (an OpenCLIP state dict does not say; the
      activation and LayerNorm eps of the formats that do are the
      defaults), image_size (positional embeddings are interpolated),
      tubelet, dtype ('bfloat16'), attention, remat, scan.

  Returns:
    The CLIP model; `encode_video`/`encode_text` as in `vidjax.models.clip`.
  """
  source = convert(state_dict)
  spec = _spec(
    "clip",
    _clip_config(source),
    {"num_frames": num_frames},
    _fact_keys(source, "clip"),
    overrides,
  )
  return init_from.build(
    lambda: CLIP(spec, rngs=rngs or nnx.Rngs(0)),
    source,
    "clip",
    tubelet=spec.vision.tubelet,
    keep_init=keep_init,
    patch_inflation=patch_inflation,
  )


def _videomae_config(source: init_from.Source) -> dict:
  config = _vision_sizes(source, "encoder", "VideoMAE")
  if "encoder_to_decoder.kernel" in source.tensors:
    width = source.tensors["encoder_to_decoder.kernel"].shape[1]
    config.update(
      {
        "decoder.width": width,
        "decoder.heads": width // 64,
        "decoder.depth": _count(source.tensors, "decoder.layers"),
      }
    )
  return config


def videomae_from_state_dict(
  state_dict: dict, *, rngs: nnx.Rngs | None = None, **overrides
) -> VideoMAE:
  """A VideoMAE pretraining model from an original, HF or AVION checkpoint.

  Sizes come from the shapes (heads = width / 64); image_size and
  num_frames (not stored: positions are sinusoid) default to 224 and 16.
  """
  source = convert(state_dict)
  spec = _spec(
    "videomae",
    _videomae_config(source),
    _fact_keys(source, "videomae"),
    overrides,
  )
  return init_from.build(
    lambda: VideoMAE(spec, rngs=rngs or nnx.Rngs(0)),
    source,
    "videomae",
    tubelet=spec.encoder.tubelet,
  )


def classifier_from_state_dict(
  state_dict: dict,
  *,
  num_classes: int,
  patch_inflation: str = "center",
  rngs: nnx.Rngs | None = None,
  **overrides,
) -> Classifier:
  """A classifier initialised from a CLIP or a VideoMAE checkpoint.

  CLIP: the vision tower (its projection and the text tower are dropped),
  backbone='clip'. VideoMAE (pretrained or fine-tuned): the encoder,
  backbone='videomae'. The head is loaded only if the checkpoint has one
  with `num_classes` outputs; otherwise it starts fresh (logged).
  """
  source = convert(state_dict)
  prefix = "visual" if source.kind == "clip" else "encoder"
  sizes = _vision_sizes(source, prefix, source.backbone)
  if source.backbone == "clip":
    sizes.update(tubelet=1, num_frames=1)
  else:
    sizes.pop("image_size", None)
  spec = _spec(
    "classifier",
    sizes,
    {"backbone": source.backbone, "num_classes": num_classes},
    _fact_keys(source, "classifier"),
    overrides,
  )
  return init_from.build(
    lambda: Classifier(spec, rngs=rngs or nnx.Rngs(0)),
    source,
    "classifier",
    tubelet=spec.encoder.tubelet,
    patch_inflation=patch_inflation,
  )
