"""What each export format writes: its files, and what its own code needs told.

Each `FORMATS[name](model)` takes a `Model` (a run's parameters, our
layout, and the spec they were trained under) and returns the `Files` of
that format, or refuses (a `ConfigError` naming what the format cannot
hold). Every format also records what the model computed with
(`facts.RECORDED`: activation, LayerNorm eps, pooling, temperature), so
that `--config.init_from` of the export settles the same model.

  avion        AVION's / LaViLa's video CLIP (`CLIP_VITB16`'s names) or its
               classifier (`VideoClassifier`, `fc_cls`): checkpoint_best.pt
               ({'state_dict': 'module.'-names, 'args': Namespace}, with
               torch) and checkpoint_best.safetensors (plain names)
  open_clip    a one-frame CLIP as OpenCLIP builds it: open_clip_config.json
               + open_clip_model.safetensors (create_model('local-dir:OUT'))
  hf           a VideoMAE (pretraining or classifier) as transformers'
               save_pretrained writes it: config.json + model.safetensors
  safetensors  vidjax's own names (layers as the run stored them), the
               run's config in the file's metadata and in config.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
from typing import Any

import numpy as np

from vidjax.base import errors
from vidjax.export import layouts
from vidjax.weights import facts as facts_lib

# AVION's CLIP_VITB16 builds its towers with these (DESIGN: its use_quick_gelu
# flag is swallowed; its vision LayerNorms are eps 1e-6).
AVION_COMPUTES = {"act": "gelu", "ln_eps": 1e-6, "text.ln_eps": 1e-5}
# transformers' VideoMAE: fc_norm and the decoder's last norm are
# nn.LayerNorm(width), PyTorch's eps, whatever the config says.
HF_FIXED_EPS = 1e-5


@dataclasses.dataclass
class Model:
  """A run's model, as export reads it.

  kind: 'clip', 'videomae', 'classifier' (or 'umt').
  spec: the `vidjax.models.spec` the parameters were trained under.
  tensors: {our path, layers unstacked: float32 array in our layout}.
  params: {our path as stored (stacked layers under scan): array}.
  config: the run's config (a dict, as saved with the checkpoint).
  facts: `facts.run_facts` of it: {config.model key: (value, why)}.
  frames: for a CLIP, the temporal table folded to one frame ('--frames 1').
  """

  kind: str
  spec: Any
  tensors: dict[str, np.ndarray]
  params: dict[str, np.ndarray]
  config: dict
  facts: dict
  frames: int | None = None

  def fact(self, key: str):
    return self.facts.get(key, (None,))[0]

  @property
  def vision(self):
    return self.spec.vision if self.kind == "clip" else self.spec.encoder


@dataclasses.dataclass
class Files:
  """One format's output: `tensors` is {file name: (state dict, metadata)}
  written as safetensors; `pickles` {file name: object} written with
  torch.save; `json` {file name: dict}; `notes`: what the format's own code
  must be told (the card and the console say it); `skipped`: files not
  written, and why."""

  tensors: dict[str, tuple[dict, dict]] = dataclasses.field(
    default_factory=dict
  )
  pickles: dict[str, Any] = dataclasses.field(default_factory=dict)
  json: dict[str, dict] = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)
  skipped: list[str] = dataclasses.field(default_factory=list)


def recorded_facts(model: Model) -> str:
  """The model's facts as the JSON every format carries (`facts.RECORDED`)."""
  return json.dumps({key: value for key, (value, _) in model.facts.items()})


def _refuse(fmt: str, what: str, hint: str) -> errors.ConfigError:
  return errors.ConfigError(f"--format {fmt} cannot hold {what}", hint=hint)


def _refuse_student(model: Model, fmt: str) -> None:
  """A distilled student (UMT): no format but vidjax's holds its heads."""
  if model.kind == "umt":
    raise _refuse(
      fmt,
      "a distilled student (UMT): its format has no place for the heads "
      "that aligned it to its teacher",
      "fine-tune it (--config.init_from=RUN, e.g. configs/k400_ft.py) and "
      "export the classifier, or use --format safetensors",
    )


def _one_frame(model: Model, fmt: str) -> dict:
  """A CLIP's tensors with its temporal table gone: kept (AVION, several
  frames), or folded into the patch rows of the positional table where the
  format has no temporal table (one frame: what vidjax computes for a
  one-frame clip of this model, whose table it truncates to its first row)."""
  vision, tensors = model.vision, dict(model.tensors)
  prefix = "visual." if model.kind == "clip" else "encoder."
  if vision.tubelet != 1:
    raise _refuse(
      fmt,
      f"a CLIP with tubelets of {vision.tubelet} frames (its patch "
      "embedding is per frame)",
      "--format safetensors holds it",
    )
  temporal = tensors.pop(prefix + "temporal_pos")
  frames = vision.num_frames
  if fmt == "avion" and frames > 1:
    tensors[prefix + "temporal_pos"] = temporal
    return tensors
  if frames > 1 and model.frames != 1:
    raise _refuse(
      fmt,
      f"a {frames}-frame video CLIP: OpenCLIP's towers embed one image",
      "add --frames 1 to export the model as it embeds one frame (its "
      "first temporal row folded into the positional table: what "
      "--config.model.num_frames=1 computes from this run), or use "
      "--format avion",
    )
  if np.any(temporal[0]):
    spatial = tensors[prefix + "spatial_pos"].copy()
    spatial[1:] += temporal[0]
    tensors[prefix + "spatial_pos"] = spatial
  return tensors


def _temperature(model: Model, canonical: dict) -> None:
  """A CLIP whose temperature was not trained has it as a buffer, not a
  parameter: the formats store it as `logit_scale` all the same."""
  if model.kind == "clip" and "logit_scale" not in canonical:
    scale = model.fact("logit_scale_init") or model.spec.logit_scale_init
    canonical["logit_scale"] = np.asarray(scale, np.float32)


def _computed(model: Model, keys) -> dict:
  return {key: model.fact(key) for key in keys}


def avion(model: Model) -> Files:
  """AVION's CLIP_VITB16 / VideoClassifier layout (flash attention, fast
  conv1), .pt with torch and .safetensors."""
  _refuse_student(model, "avion")
  if model.fact("backbone") != "clip" or model.kind not in (
    "clip",
    "classifier",
  ):
    raise _refuse(
      "avion",
      f"a {model.kind} model"
      + (" with a VideoMAE backbone" if model.kind == "classifier" else ""),
      "AVION's layout here is its video CLIP and CLIP classifier; export a "
      "VideoMAE with --format hf, anything else with --format safetensors",
    )
  tensors = _one_frame(model, "avion")
  canonical, homeless = layouts.clip_canonical(
    tensors, kind=model.kind, tubelet=1
  )
  layouts.refuse_homeless(homeless, "avion", f"{model.kind} model")
  _temperature(model, canonical)
  state_dict = layouts.avion_names(canonical)
  vision = model.vision
  files = Files()
  wanted = {k: model.fact(k) for k in AVION_COMPUTES if model.fact(k)}
  differ = {k: v for k, v in wanted.items() if v != AVION_COMPUTES[k]}
  if differ:
    files.notes.append(
      "AVION's CLIP_VITB16 builds its towers with "
      + ", ".join(f"{k}={AVION_COMPUTES[k]}" for k in differ)
      + "; this model computed "
      + ", ".join(f"{k}={v}" for k, v in differ.items())
      + ": build AVION's VisionTransformer/TextTransformer with those "
      "(act_layer, norm_layer eps), as the snippet below does"
    )
  args = dict(
    model="CLIP_VITB16" if model.kind == "clip" else "VideoClassifier",
    clip_length=vision.num_frames,
    use_flash_attn=True,
    use_fast_conv1=True,
    project_embed_dim=model.spec.vision.output_dim
    if model.kind == "clip"
    else None,
    num_classes=getattr(model.spec, "num_classes", None),
  )
  args[facts_lib.RECORDED] = recorded_facts(model)
  metadata = {"format": "pt", facts_lib.RECORDED: args[facts_lib.RECORDED]}
  files.tensors["checkpoint_best.safetensors"] = (state_dict, metadata)
  if importlib.util.find_spec("torch") is None:
    files.skipped.append(
      "checkpoint_best.pt: PyTorch is not installed here (pip install torch, "
      "or vidjax[parity]); the .safetensors holds the same state dict"
    )
  else:
    files.pickles["checkpoint_best.pt"] = {
      "epoch": None,
      "state_dict": {f"module.{k}": v for k, v in state_dict.items()},
      "args": argparse.Namespace(**args),
    }
  return files


def open_clip(model: Model) -> Files:
  """A one-frame CLIP for OpenCLIP's create_model('local-dir:OUT')."""
  _refuse_student(model, "open_clip")
  if model.kind != "clip":
    raise _refuse(
      "open_clip",
      f"a {model.kind} model (OpenCLIP holds a CLIP's two towers)",
      "--format avion holds a CLIP classifier, --format hf a VideoMAE, "
      "--format safetensors anything",
    )
  tensors = _one_frame(model, "open_clip")
  canonical, homeless = layouts.clip_canonical(tensors, kind="clip", tubelet=1)
  layouts.refuse_homeless(homeless, "open_clip", "CLIP")
  _temperature(model, canonical)
  spec, act = model.spec, model.fact("act")
  vision, text = spec.vision, spec.text
  files = Files()
  config = {
    "model_cfg": {
      "embed_dim": vision.output_dim,
      "quick_gelu": act == "quick_gelu",
      "vision_cfg": {
        "image_size": list(vision.image_size),
        "layers": vision.blocks.depth,
        "width": vision.blocks.width,
        "head_width": vision.blocks.width // vision.blocks.heads,
        "mlp_ratio": vision.blocks.mlp_dim / vision.blocks.width,
        "patch_size": vision.patch_size,
        "norm_kwargs": {"eps": vision.blocks.ln_eps},
      },
      "text_cfg": {
        "context_length": text.context_length,
        "vocab_size": text.vocab_size,
        "width": text.blocks.width,
        "heads": text.blocks.heads,
        "layers": text.blocks.depth,
        "mlp_ratio": text.blocks.mlp_dim / text.blocks.width,
        "norm_kwargs": {"eps": text.blocks.ln_eps},
      },
    },
    "preprocess_cfg": preprocess(model),
  }
  files.json["open_clip_config.json"] = config
  metadata = {"format": "pt", facts_lib.RECORDED: recorded_facts(model)}
  files.tensors["open_clip_model.safetensors"] = (canonical, metadata)
  if vision.num_frames > 1:
    files.notes.append(
      f"exported as it embeds one frame (--frames 1): the run trained on "
      f"{vision.num_frames}-frame clips"
    )
  return files


def preprocess(model: Model) -> dict:
  """The run's input normalisation and size, OpenCLIP's preprocess_cfg."""
  augment = model.config.get("augment") or {}
  return {
    "size": list(model.vision.image_size),
    "mean": list(augment.get("mean") or ()),
    "std": list(augment.get("std") or ()),
  }


def hf(model: Model) -> Files:
  """A VideoMAE as transformers' save_pretrained writes it."""
  _refuse_student(model, "hf")
  backbone = model.fact("backbone")
  if model.kind not in ("videomae", "classifier") or backbone != "videomae":
    raise _refuse(
      "hf",
      f"a {model.kind} model"
      + (" with a CLIP backbone" if backbone == "clip" else ""),
      "--format hf writes VideoMAE models; a CLIP goes to --format avion "
      "or open_clip, anything else to --format safetensors",
    )
  vision, pool = model.vision, model.fact("pool") or "none"
  canonical, homeless = layouts.videomae_canonical(
    model.tensors, kind=model.kind, pool=pool, tubelet=vision.tubelet
  )
  layouts.refuse_homeless(homeless, "hf", f"{model.kind} model")
  state_dict, key_bias = layouts.hf_videomae_names(canonical)
  blocks, files = vision.blocks, Files()
  config = {
    "model_type": "videomae",
    "image_size": vision.image_size[0],
    "patch_size": vision.patch_size,
    "num_channels": 3,
    "num_frames": vision.num_frames,
    "tubelet_size": vision.tubelet,
    "hidden_size": blocks.width,
    "num_hidden_layers": blocks.depth,
    "num_attention_heads": blocks.heads,
    "intermediate_size": blocks.mlp_dim,
    "hidden_act": blocks.act,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "layer_norm_eps": blocks.ln_eps,
    "qkv_bias": blocks.qkv_bias,
    "use_mean_pooling": pool == "mean",
    facts_lib.RECORDED: json.loads(recorded_facts(model)),
  }
  if vision.image_size[0] != vision.image_size[1]:
    raise _refuse("hf", "a non-square input", "use --format safetensors")
  fixed = {}  # Our eps where transformers fixes PyTorch's.
  if model.kind == "videomae":
    decoder = model.spec.decoder
    config.update(
      architectures=["VideoMAEForPreTraining"],
      decoder_hidden_size=decoder.width,
      decoder_num_hidden_layers=decoder.depth,
      decoder_num_attention_heads=decoder.heads,
      decoder_intermediate_size=decoder.mlp_dim,
      norm_pix_loss=model.spec.norm_pix_loss,
      use_mean_pooling=False,  # Its encoder's last norm: videomae.layernorm.
    )
    fixed["decoder.norm"] = model.fact("decoder.ln_eps") or decoder.ln_eps
  else:
    classes = model.spec.num_classes
    config.update(
      architectures=["VideoMAEForVideoClassification"],
      id2label={str(i): f"LABEL_{i}" for i in range(classes)},
      label2id={f"LABEL_{i}": i for i in range(classes)},
    )
    eps = (
      vision.head_ln_eps if vision.head_ln_eps is not None else blocks.ln_eps
    )
    if pool == "mean":
      fixed["fc_norm"] = eps
    elif eps != blocks.ln_eps:
      fixed["videomae.layernorm"] = eps
  for module, eps in fixed.items():
    if eps != HF_FIXED_EPS:
      files.notes.append(
        f"transformers builds {module} with LayerNorm eps {HF_FIXED_EPS:g} "
        f"(no config key sets it); this model's is {eps:g}: set "
        f"model.{module}.eps = {eps:g} after from_pretrained, as the "
        "snippet below does"
      )
  if key_bias:
    files.notes.append(
      f"the attention's key biases (largest {key_bias:.3g}) are not "
      "stored: transformers' VideoMAE has none, and softmax ignores them "
      "(they add the same to every logit of a query)"
    )
  files.json["config.json"] = config
  files.tensors["model.safetensors"] = (state_dict, {"format": "pt"})
  return files


def safetensors(model: Model) -> Files:
  """vidjax's own parameter names, with the run's config."""
  files = Files()
  metadata = {
    "format": "vidjax",
    facts_lib.RUN_CONFIG: json.dumps(model.config),
    facts_lib.RECORDED: recorded_facts(model),
  }
  files.tensors["params.safetensors"] = (model.params, metadata)
  files.json["config.json"] = model.config
  return files


FORMATS = {
  "avion": avion,
  "open_clip": open_clip,
  "hf": hf,
  "safetensors": safetensors,
}
