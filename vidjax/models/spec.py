"""The model spec: one frozen description of a model, from `config.model`.

`from_config(config.model)` settles once everything construction needs (the
variant's sizes, the drop-path rate of each block, the dtypes, a
classifier's backbone style, the switches of VideoMAE's encoder) into a
tree of frozen dataclasses, and each module takes its part whole:

  ClipSpec        vision: Vision, text: Text, logit scale   -> clip.CLIP
  VideoMAESpec    encoder: Vision, decoder: Stack, masking  -> VideoMAE
  ClassifierSpec  encoder: Vision, head                     -> Classifier
  UMTSpec         encoder: Vision, teacher: Vision, alignment -> umt.UMT
  Vision          blocks: Stack, patches, positions, pooling, projection,
                  masked training                -> vit.VisionTransformer
  Text            blocks: Stack, vocabulary, context, projection
                                                 -> text.TextTransformer
  Stack           width, depth, heads, MLP, act, eps, drop path, compute
                                                 -> transformer.Transformer
  Compute         dtypes, attention, remat, scan (every stack's the same)

A variant is another spec (`dataclasses.replace`, `unmasked`,
`with_compute`) and the model built from it, never an edited graph.

A new knob is a field here, named as its `config.model` key (`fill` copies
each key of the config to the field of its name, in nested specs too), and
the line of the module that reads it; its default goes in
`vidjax.config.defaults.model_config`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import jax
import jax.numpy as jnp

from vidjax.config import defaults
from vidjax.models.transformer import drop_path_rates
from vidjax.models.videomae import BACKBONE_STYLES


def resolve_dtype(name):
  """'bfloat16' | 'float32' | 'float16' | 'auto' (or a dtype) -> a jnp dtype."""
  if not isinstance(name, str):
    return jnp.dtype(name).type
  if name == "auto":
    return jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
  if name not in defaults.DTYPES:
    raise ValueError(
      f"model dtype must be one of {defaults.DTYPES}, got {name!r}"
    )
  return jnp.dtype(name).type


def _settle(spec, **values):
  """Sets fields of a frozen spec in its `__post_init__`."""
  for name, value in values.items():
    object.__setattr__(spec, name, value)


@dataclasses.dataclass(frozen=True)
class Compute:
  """How every transformer stack of a model computes.

  Attributes:
    dtype: compute dtype of matmuls and attention (parameters are float32).
    residual_dtype: the residual stream between blocks.
    norm_dtype: the blocks' LayerNorm statistics.
    attention: 'auto' | 'xla' | 'cudnn' (`attention.py`).
    remat: per-block rematerialisation (`transformer.REMAT_POLICIES`).
    scan: scan over blocks (parameters stacked by depth).
  Dtypes may be given by name ('auto' included): they are resolved here.
  """

  dtype: Any = jnp.float32
  residual_dtype: Any = jnp.float32
  norm_dtype: Any = jnp.float32
  attention: str = "auto"
  remat: str = "none"
  scan: bool = False

  def __post_init__(self):
    _settle(
      self,
      dtype=resolve_dtype(self.dtype),
      residual_dtype=resolve_dtype(self.residual_dtype),
      norm_dtype=resolve_dtype(self.norm_dtype),
    )


@dataclasses.dataclass(frozen=True)
class Stack:
  """A stack of pre-LN transformer blocks (`transformer.Transformer`).

  Attributes:
    width, depth, heads: D, blocks, attention heads.
    mlp_dim: the MLP's hidden size (None: 4 x width).
    act: 'quick_gelu' or 'gelu' (`transformer.ACTIVATIONS`).
    qkv_bias: biases on the fused QKV projection.
    ln_eps: the blocks' LayerNorm eps.
    drop_path: one stochastic-depth rate per block, or one rate for a
      linear schedule from 0 (`transformer.drop_path_rates`).
    compute: how the blocks compute.
  """

  width: int
  depth: int
  heads: int
  mlp_dim: int | None = None
  act: str = "quick_gelu"
  qkv_bias: bool = True
  ln_eps: float = 1e-5
  drop_path: tuple[float, ...] | float = 0.0
  compute: Compute = Compute()

  def __post_init__(self):
    rates = self.drop_path
    _settle(
      self,
      mlp_dim=self.mlp_dim or 4 * self.width,
      drop_path=tuple(float(r) for r in rates)
      if isinstance(rates, (tuple, list))
      else drop_path_rates(rates, self.depth),
    )


@dataclasses.dataclass(frozen=True)
class Vision:
  """The video ViT (`vit.VisionTransformer`; see its docstrings).

  Attributes:
    blocks: its stack.
    patch_size, image_size, num_frames, tubelet: p, (H, W) (an int: a
      square), T and t; tubelets of t frames x p x p pixels.
    class_token, pos_embed ('learned' | 'sincos'), pre_norm, patch_bias:
      the architecture switches of CLIP's and VideoMAE's ViTs.
    pool: 'token' | 'mean' | 'none'.
    head_ln_eps: the pooled LayerNorm's eps (None: the blocks').
    output_dim: the projection's size (None: no projection).
    mask_ratio, mask_kind: masked training (FLIP).
  """

  blocks: Stack
  patch_size: int = 16
  image_size: tuple[int, int] | int = (224, 224)
  num_frames: int = 1
  tubelet: int = 1
  class_token: bool = True
  pos_embed: str = "learned"
  pre_norm: bool = True
  patch_bias: bool = False
  pool: str = "token"
  head_ln_eps: float | None = None
  output_dim: int | None = None
  mask_ratio: float = 0.0
  mask_kind: str = "random"

  def __post_init__(self):
    size = self.image_size
    _settle(
      self,
      image_size=(size, size) if isinstance(size, int) else tuple(size),
      mask_ratio=float(self.mask_ratio),
    )

  @property
  def grid(self) -> tuple[int, int, int]:
    """Tokens along (time, rows, columns): (T/t, H/p, W/p)."""
    height, width = self.image_size
    return (
      self.num_frames // self.tubelet,
      height // self.patch_size,
      width // self.patch_size,
    )


@dataclasses.dataclass(frozen=True)
class Text:
  """CLIP's text tower (`text.TextTransformer`): its stack, vocabulary,
  context length (tokens) and projection size."""

  blocks: Stack
  vocab_size: int = defaults.VOCAB_SIZE
  context_length: int = defaults.CONTEXT_LENGTH
  output_dim: int = 512


@dataclasses.dataclass(frozen=True)
class ClipSpec:
  """The video-text dual encoder (`clip.CLIP`).

  Attributes:
    vision, text: the towers (their `output_dim` is the joint embedding).
    logit_scale_init: log(1/temperature) at init.
    learn_logit_scale: whether it is trained.
  """

  vision: Vision
  text: Text
  logit_scale_init: float = defaults.INIT_LOGIT_SCALE
  learn_logit_scale: bool = True

  @property
  def embed_dim(self) -> int:
    return self.vision.output_dim


@dataclasses.dataclass(frozen=True)
class VideoMAESpec:
  """VideoMAE pretraining (`videomae.VideoMAE`).

  Attributes:
    encoder: the ViT (VideoMAE style, pool 'none', no projection).
    decoder: the decoder's stack.
    mask_ratio: tube masking's share of each frame's patches.
    norm_pix_loss: per-patch normalised targets.
    decoder_ln_eps: the eps of the decoder's last LayerNorm (None: its
      blocks'; `config.model.decoder.ln_eps`).
  """

  encoder: Vision
  decoder: Stack
  mask_ratio: float = 0.9
  norm_pix_loss: bool = True
  decoder_ln_eps: float | None = None


@dataclasses.dataclass(frozen=True)
class ClassifierSpec:
  """A ViT, pooled, and a linear head (`videomae.Classifier`).

  Attributes:
    encoder: the ViT (pool 'mean' or 'token', no projection).
    num_classes: the head's size.
    head_dropout: dropout before the head.
    head_init_scale: the head's init std is 0.02 x this.
    probe: '' (fine-tune everything), or a probe on the frozen encoder:
      'linear' (the head on the averaged patch tokens) or 'attentive'
      (`probe.AttentiveProbe` over the patch tokens); `defaults.PROBES`.
  """

  encoder: Vision
  num_classes: int
  head_dropout: float = 0.0
  head_init_scale: float = 0.001
  probe: str = ""


@dataclasses.dataclass(frozen=True)
class UMTSpec:
  """A student distilled from a frozen CLIP (`umt.UMT`).

  Attributes:
    encoder: the student ViT (VideoMAE style, pool 'none').
    teacher: the CLIP vision tower (one frame, pool 'none', its
      projection; image size: the student's grid times its patch).
    align_layers: K, the last blocks of both that are aligned.
    mask_ratio: the share of each frame's patches dropped.
    select: which patches a frame keeps (`defaults.SELECTIONS`).
  """

  encoder: Vision
  teacher: Vision
  align_layers: int = 6
  mask_ratio: float = 0.8
  select: str = "attention"


ModelSpec = ClipSpec | VideoMAESpec | ClassifierSpec | UMTSpec


@functools.cache
def _nested(cls) -> dict[str, type]:
  """The fields of `cls` that are specs themselves, with their classes."""
  hints = typing.get_type_hints(cls)
  return {
    f.name: hints[f.name]
    for f in dataclasses.fields(cls)
    if dataclasses.is_dataclass(hints[f.name])
  }


def fill(cls, values, **given):
  """A `cls` spec: each field from `given`, else `values[name]`, else (a
  nested spec) filled from the same `values`, else its default.

  Args:
    cls: a spec class of this module.
    values: a mapping (e.g. `config.model`); keys that are no field are
      ignored, and so are None values.
    **given: fields set explicitly.
  """
  names = {f.name for f in dataclasses.fields(cls)}
  if unknown := set(given) - names:
    raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
  nested = _nested(cls)
  fields = {}
  for name in names:
    if name in given:
      fields[name] = given[name]
    elif values.get(name) is not None:
      fields[name] = values[name]
    elif name in nested:
      fields[name] = fill(nested[name], values)
  return cls(**fields)


def _vision_values(config) -> dict:
  """`config.model` with the variant's sizes and the drop-path rates."""
  sizes = defaults.parse_variant(config.variant)
  for key in ("width", "depth", "heads", "mlp_dim"):
    if config[key] is not None:
      sizes[key] = config[key]
  if config.mlp_dim is None:
    sizes["mlp_dim"] = 4 * sizes["width"]
  rates = drop_path_rates(
    config.drop_path, sizes["depth"], config.drop_path_schedule
  )
  return {**config, **sizes, "drop_path": rates}


def _switches(backbone: str) -> tuple[dict, dict]:
  """A backbone's style (`videomae.BACKBONE_STYLES`): the ViT's switches
  and the blocks' act and ln_eps."""
  if backbone not in BACKBONE_STYLES:
    raise ValueError(
      f"backbone must be one of {sorted(BACKBONE_STYLES)}, got {backbone!r}"
    )
  vision = dict(BACKBONE_STYLES[backbone])
  return vision, {key: vision.pop(key) for key in ("act", "ln_eps")}


def from_config(config) -> ModelSpec:
  """The spec of the model `config` (a `config.model`) describes.

  Facts the config leaves to the weights (`vidjax.weights.facts`) are
  settled in it before; a classifier's act, ln_eps and pool left empty
  take its backbone's (`videomae.BACKBONE_STYLES`).
  """
  if config.name not in defaults.MODELS:
    raise ValueError(
      f"config.name must be one of {defaults.MODELS}, got {config.name!r}"
    )
  values = _vision_values(config)
  compute = fill(Compute, values)
  if config.name == "clip":
    text = {**config.text, "depth": config.text.layers}
    switches, _ = _switches("clip")
    return fill(
      ClipSpec,
      values,
      vision=fill(
        Vision, values, **switches, pool="token", output_dim=config.embed_dim
      ),
      text=fill(
        Text,
        text,
        output_dim=config.embed_dim,
        blocks=fill(Stack, text, act=config.act, compute=compute),
      ),
    )
  if config.name == "umt":
    switches, _ = _switches("videomae")
    return fill(
      UMTSpec,
      values,
      encoder=fill(Vision, values, **switches, pool="none", mask_ratio=0.0),
      teacher=_teacher(config, values),
    )
  if config.name == "videomae":
    decoder = {**config.decoder, "act": config.act, "ln_eps": config.ln_eps}
    switches, _ = _switches("videomae")
    return fill(
      VideoMAESpec,
      values,
      decoder_ln_eps=config.decoder.get("ln_eps"),
      encoder=fill(Vision, values, **switches, pool="none", mask_ratio=0.0),
      decoder=fill(Stack, decoder, mlp_dim=None, compute=compute),
    )
  switches, stack = _switches(config.backbone)
  for key in ("act", "ln_eps"):  # Empty: the backbone's.
    if config[key] not in (None, ""):
      stack[key] = config[key]
  pool = config.pool or ("token" if switches["class_token"] else "mean")
  return fill(
    ClassifierSpec,
    values,
    encoder=fill(
      Vision,
      values,
      **switches,
      blocks=fill(Stack, values, **stack),
      pool=pool,
      mask_ratio=0.0,
    ),
  )


def _teacher(config, values) -> Vision:
  """A distilled student's teacher (`config.teacher`): a one-frame CLIP
  tower whose patch grid is the student's, computing in its own dtype,
  neither rematerialised nor scanned (it has no backward pass)."""
  teacher = config.teacher
  sizes = defaults.parse_variant(teacher.variant)
  for key in ("width", "depth", "heads", "mlp_dim"):
    if teacher[key] is not None:
      sizes[key] = teacher[key]
  patch = sizes.pop("patch_size")
  size = values["image_size"]
  height, width = (size, size) if isinstance(size, int) else size
  student_patch = defaults.parse_variant(config.variant)["patch_size"]
  switches, _ = _switches("clip")
  compute = Compute(dtype=teacher.dtype, attention=config.attention)
  return Vision(
    blocks=Stack(
      **sizes, act=teacher.act, ln_eps=teacher.ln_eps, compute=compute
    ),
    patch_size=patch,
    image_size=(
      height // student_patch * patch,
      width // student_patch * patch,
    ),
    pool="none",
    output_dim=teacher.embed_dim,
    **switches,
  )


# ---------------------------------------------------------------- variants


def unmasked(spec: ModelSpec) -> ModelSpec:
  """`spec` whose video tower trains on every token (a CLIP's evaluation
  and its unmasked tuning); any other spec as given."""
  if isinstance(spec, ClipSpec) and spec.vision.mask_ratio:
    return dataclasses.replace(
      spec, vision=dataclasses.replace(spec.vision, mask_ratio=0.0)
    )
  return spec


def with_compute(spec, **changes):
  """`spec` with `changes` (fields of `Compute`, e.g. remat='full') in the
  compute of every stack it holds."""
  if isinstance(spec, Compute):
    return dataclasses.replace(spec, **changes)
  return dataclasses.replace(
    spec,
    **{
      name: with_compute(getattr(spec, name), **changes)
      for name in _nested(type(spec))
    },
  )


def of(name: str, **keys) -> ModelSpec:
  """The spec of `defaults.model_config(name)` updated with `keys` (its
  keys; a section's as a dict, e.g. text=dict(width=64)).

  E.g. `of("videomae", variant="Ti/16", image_size=32, num_frames=4)`.
  """
  config = defaults.model_config(name)
  config.update(keys)
  return from_config(config)
