"""Reference outputs of the implementations vidjax is checked against.

    python tests/reference/make_reference.py [NAME ...]   # -> tests/reference/

Each function below runs a reference implementation (OpenCLIP, torch,
torchvision: the `[parity]` extra, at constraints.txt's versions) on small,
seeded, non-trivial weights and inputs, and returns what the parity tests
compare with: {name: numpy array}, written to `NAME.npz` (and, for
OpenCLIP, the TorchScript archive `openclip_vit.pt`, as OpenAI releases
them). The default test suite reads the committed files; with the
reference implementations installed, the same tests also call these
functions again and check that the committed outputs still match
(`check_live`).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
import sys

import numpy as np

HERE = Path(__file__).resolve().parent
# A small OpenAI-architecture CLIP (QuickGELU): 2 layers per tower, a 32x32
# image of 2x2 patches, a 256-token vocabulary.
OPENCLIP = dict(
  embed_dim=24,
  image_size=32,
  patch=16,
  width=32,
  layers=2,
  heads=2,
  text_width=32,
  text_heads=2,
  vocab_size=256,
)


def _perturbed(model, seed: int) -> None:
  """Seeded noise on every parameter: biases non-zero, LayerNorms not 1/0,
  as in trained weights (OpenCLIP initialises many of them to 0 or 1)."""
  import torch

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for param in model.parameters():
      param += 0.05 * torch.randn(param.shape, generator=generator)


def openclip(archive: Path | None = None) -> dict[str, np.ndarray]:
  """OpenCLIP's image and text embeddings of a small CLIP, its weights
  rounded to fp16 as released; with `archive`, the model is also saved
  there as OpenAI's TorchScript `.pt` (fp16, with `input_resolution`,
  `context_length` and `vocab_size` entries).

  Returns:
    `sd/NAME`: the archive's tensors as torch.jit.load reads them (fp16;
    the 3 entries int64); `images` float32[2, 3, 32, 32]; `tokens`
    int64[2, 77]; `image` / `text`: float32[2, 24] embeddings.
  """
  import open_clip
  import torch

  c = OPENCLIP
  torch.manual_seed(0)
  model = open_clip.CLIP(
    c["embed_dim"],
    open_clip.CLIPVisionCfg(
      layers=c["layers"],
      width=c["width"],
      head_width=c["width"] // c["heads"],
      patch_size=c["patch"],
      image_size=c["image_size"],
    ),
    open_clip.CLIPTextCfg(
      context_length=77,
      vocab_size=c["vocab_size"],
      width=c["text_width"],
      heads=c["text_heads"],
      layers=c["layers"],
    ),
    quick_gelu=True,
  )
  _perturbed(model, seed=1)
  model = model.half().float().eval()  # The released weights are fp16.
  rng = np.random.default_rng(0)
  size = c["image_size"]
  images = rng.standard_normal((2, 3, size, size)).astype(np.float32)
  tokens = np.zeros((2, 77), np.int64)
  eot = c["vocab_size"] - 1  # The end token has the largest id, as CLIP's.
  tokens[0, :5] = [eot - 1, 20, 112, 7, eot]  # start, 3 words, end
  tokens[1, :3] = [eot - 1, 43, eot]
  with torch.no_grad():
    image = model.encode_image(torch.from_numpy(images)).numpy()
    text = model.encode_text(torch.from_numpy(tokens)).numpy()
  layout = _openai_layout(model).half()
  if archive is None:
    state = layout.state_dict()
  else:
    traced = torch.jit.trace(
      layout, torch.zeros(1, 3, 16, 16).half(), check_trace=False
    )
    traced.save(str(archive))
    state = torch.jit.load(str(archive)).state_dict()
  out = {f"sd/{k}": v.numpy() for k, v in state.items()}
  return dict(out, images=images, tokens=tokens, image=image, text=text)


def _openai_layout(clip):
  """OpenCLIP's modules under OpenAI's names, plus the archive's extras."""
  import torch

  class OpenAILayout(torch.nn.Module):
    def __init__(self):
      super().__init__()
      for name, module in clip.named_children():
        self.add_module(name, module)
      for name, param in clip.named_parameters(recurse=False):
        self.register_parameter(name, param)
      for name, value in (
        ("input_resolution", OPENCLIP["image_size"]),
        ("context_length", 77),
        ("vocab_size", OPENCLIP["vocab_size"]),
      ):
        self.register_buffer(name, torch.tensor(value))

    def forward(self, image):
      return self.visual.conv1(image)

  return OpenAILayout()


def smooth_clip(seed=0, t=3, h=24, w=32) -> np.ndarray:
  """A smooth uint8 clip [T, H, W, 3] (gradients + blobs): realistic
  histograms for the colour ops."""
  rng = np.random.default_rng(seed)
  ys, xs = np.mgrid[0:h, 0:w]
  frames = []
  for _ in range(t):
    base = (
      rng.uniform(30, 200, 3) + 40 * np.sin(xs / rng.uniform(3, 8))[..., None]
    )
    frames.append(base + 30 * np.cos(ys / rng.uniform(2, 6))[..., None])
  return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


# RandAugment's geometric ops checked, with their values.
WARPS = (
  ("shear_x", 0.21),
  ("shear_y", -0.21),
  ("translate_x", 0.3),
  ("translate_y", -0.2),
)


def _affine(x, matrix, fill=0.5):
  """pytorchvideo's affine: grid_sample of a centred pixel map, grey fill.
  x: float [T, C, H, W]; matrix: the 2x3 map of output to input pixels."""
  import torch

  _, _, h, w = x.shape
  (a, b, c), (d, e, f) = matrix
  # The same map in grid_sample's normalised coordinates (align_corners=False).
  theta = torch.tensor(
    [[a, b * h / w, c / (w / 2)], [d * w / h, e, f / (h / 2)]],
    dtype=torch.float32,
  )[None]
  grid = torch.nn.functional.affine_grid(
    theta, (1, 1, h, w), align_corners=False
  )
  grid = grid.expand(x.shape[0], h, w, 2)
  warped = torch.nn.functional.grid_sample(
    torch.cat([x, torch.ones_like(x[:, :1])], 1), grid, align_corners=False
  )
  mask = warped[:, -1:]
  return warped[:, :-1] * mask + (1 - mask) * fill


def randaugment_ops() -> dict[str, np.ndarray]:
  """torchvision's (and pytorchvideo's affine) output of every RandAugment
  op on `smooth_clip()`, as float32 [T, H, W, 3] in 0-255.

  The geometric ops' 2x3 matrices are vidjax's (`matrix/NAME`, stored:
  the test checks vidjax still makes them); the warp is the reference's.
  """
  import torch
  import torchvision.transforms.functional as tvf

  from vidjax.augment import randaugment

  clip = smooth_clip()
  _, h, w, _ = clip.shape
  ref = torch.from_numpy(clip.astype(np.float32) / 255).permute(0, 3, 1, 2)
  as_uint8 = torch.from_numpy(clip).permute(0, 3, 1, 2)
  out = {
    "brightness": tvf.adjust_brightness(ref, 1.6),
    "contrast": tvf.adjust_contrast(ref, 0.4),
    "saturation": tvf.adjust_saturation(ref, 1.7),
    "sharpness": tvf.adjust_sharpness(ref, 0.3),
    "autocontrast": tvf.autocontrast(ref),
    "equalize": tvf.equalize(as_uint8).float() / 255,
    "invert": tvf.invert(ref),
    "posterize": tvf.posterize(as_uint8, 2).float() / 255,
    "solarize": tvf.solarize(ref, 0.4),
    "rotate": tvf.rotate(
      ref, 17.0, tvf.InterpolationMode.BILINEAR, fill=[0.5] * 3
    ),
  }
  matrices = {}
  for name, value in WARPS:
    matrix = np.asarray(randaugment.geometric_matrix(name, value, h, w))
    matrices[f"matrix/{name}"] = matrix.astype(np.float32)
    out[name] = _affine(ref, matrix)
  out = {
    k: (v.permute(0, 2, 3, 1).numpy() * 255).astype(np.float32)
    for k, v in out.items()
  }
  return dict(out, **matrices, clip=clip)


# Frame sizes whose every try of RandomResizedCrop misses (a 10:1 strip,
# its transpose, an odd one): its fallback box.
CROP_FRAMES = ((40, 400), (400, 40), (41, 333))


def crop_fallback() -> dict[str, np.ndarray]:
  """torchvision's RandomResizedCrop.get_params (scale 0.95-1, ratio 3/4 to
  4/3) on `CROP_FRAMES`: `boxes` int64[3, 4] as (top, left, height, width)."""
  import torch
  from torchvision import transforms

  boxes = [
    transforms.RandomResizedCrop.get_params(
      torch.zeros(3, height, width), scale=(0.95, 1.0), ratio=(3 / 4, 4 / 3)
    )
    for height, width in CROP_FRAMES
  ]
  return {"boxes": np.asarray(boxes, np.int64)}


# ------------------------------------------ Hugging Face VideoMAE, in torch

# A small transformers VideoMAE: 2 layers, 16 frames of 32x32 in 2x16x16
# tubelets, 400 classes; the pretraining's decoder 1 layer of width 32 and
# 2 heads; LayerNorm eps 1e-3 (not the default, so that config.json must be
# read).
VIDEOMAE = dict(
  width=64, heads=2, patch=16, size=32, frames=16, eps=1e-3, decoder=32
)
ARCHITECTURES = {
  "classification": "VideoMAEForVideoClassification",
  "model": "VideoMAEModel",  # saved alone: its names lack 'videomae.'
  "pretraining": "VideoMAEForPreTraining",
}
# The pretraining's bool_masked_pos [2, 8] for a 4-frame clip (2 x 2 x 2
# tubes): 3 of each time step's 4 masked, as tubes.
MASK = np.array([[1, 1, 0, 1] * 2, [0, 1, 1, 1] * 2], bool)


def random_tensors(shapes: dict, seed: int) -> dict[str, np.ndarray]:
  """Non-trivial float32 values: LayerNorm scales near 1, every bias
  non-zero."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in shapes.items():
    value = 0.2 * rng.standard_normal(shape)
    if name.endswith("weight") and len(shape) == 1:  # a LayerNorm's scale
      value += 1
    out[name] = np.asarray(value, np.float32)
  return out


def _hf_layer_shapes(prefix: str, width: int, layers: int) -> dict:
  """transformers' VideoMAELayer parameters (q/v biases, no key bias)."""
  shapes = {}
  for i in range(layers):
    p = f"{prefix}.{i}."
    for name, shape in (
      ("attention.attention.query.weight", (width, width)),
      ("attention.attention.key.weight", (width, width)),
      ("attention.attention.value.weight", (width, width)),
      ("attention.attention.q_bias", (width,)),
      ("attention.attention.v_bias", (width,)),
      ("attention.output.dense.weight", (width, width)),
      ("attention.output.dense.bias", (width,)),
      ("intermediate.dense.weight", (4 * width, width)),
      ("intermediate.dense.bias", (4 * width,)),
      ("output.dense.weight", (width, 4 * width)),
      ("output.dense.bias", (width,)),
      ("layernorm_before.weight", (width,)),
      ("layernorm_before.bias", (width,)),
      ("layernorm_after.weight", (width,)),
      ("layernorm_after.bias", (width,)),
    ):
      shapes[p + name] = shape
  return shapes


def _norm_shapes(name: str, width: int) -> dict:
  return {f"{name}.weight": (width,), f"{name}.bias": (width,)}


def hf_videomae(
  mean_pooling: bool, seed: int = 2, architecture: str = "classification"
) -> tuple[dict[str, np.ndarray], dict]:
  """The weights and config.json of a transformers VideoMAE ARCHITECTURE
  (a key of `ARCHITECTURES`) as save_pretrained writes them: 'model' (a
  VideoMAEModel) without the 'videomae.' prefix, and with its last
  LayerNorm exactly when use_mean_pooling=False."""
  width, patch = VIDEOMAE["width"], VIDEOMAE["patch"]
  decoder, pixels = VIDEOMAE["decoder"], 2 * patch * patch * 3
  shapes = {
    "videomae.embeddings.patch_embeddings.projection.weight": (
      width,
      3,
      2,
      patch,
      patch,
    ),
    "videomae.embeddings.patch_embeddings.projection.bias": (width,),
  }
  if architecture == "classification":
    shapes.update(
      {"classifier.weight": (400, width), "classifier.bias": (400,)}
    )
    final = "fc_norm" if mean_pooling else "videomae.layernorm"
    shapes.update(_norm_shapes(final, width))
  elif not mean_pooling:
    shapes.update(_norm_shapes("videomae.layernorm", width))
  shapes.update(_hf_layer_shapes("videomae.encoder.layer", width, 2))
  if architecture == "pretraining":
    shapes.update(
      {
        "encoder_to_decoder.weight": (decoder, width),
        "mask_token": (1, 1, decoder),
        **_hf_layer_shapes("decoder.decoder_layers", decoder, 1),
        **_norm_shapes("decoder.norm", decoder),
        "decoder.head.weight": (pixels, decoder),
        "decoder.head.bias": (pixels,),
      }
    )
  config = dict(
    architectures=[ARCHITECTURES[architecture]],
    model_type="videomae",
    hidden_size=width,
    num_hidden_layers=2,
    num_attention_heads=VIDEOMAE["heads"],
    intermediate_size=4 * width,
    hidden_act="gelu",
    layer_norm_eps=VIDEOMAE["eps"],
    image_size=VIDEOMAE["size"],
    patch_size=patch,
    num_channels=3,
    num_frames=VIDEOMAE["frames"],
    tubelet_size=2,
    qkv_bias=True,
    use_mean_pooling=mean_pooling,
    decoder_num_attention_heads=2,
    decoder_hidden_size=decoder,
    decoder_num_hidden_layers=1,
    decoder_intermediate_size=4 * decoder,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.02,
    norm_pix_loss=True,
    torch_dtype="float32",
    transformers_version="4.57.1",
  )
  if architecture == "classification":
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(400)}
  sd = random_tensors(shapes, seed)
  if architecture == "pretraining":
    # Small decoder input and residual branches: its last LayerNorm sees
    # little more than the position table's variance, so that its eps shows
    # (1e-12 for 1e-5: predictions 1.5e-5 off, not 2e-6).
    for name in sd:
      if name == "encoder_to_decoder.weight" or (
        name.startswith("decoder.") and ".output.dense." in name
      ):
        sd[name] *= 0.1
  if architecture == "model":
    sd = {k.removeprefix("videomae."): v for k, v in sd.items()}
  return sd, config


def hf_videomae_head(seed: int = 3) -> dict[str, np.ndarray]:
  """The classifier VideoMAEForVideoClassification.from_pretrained adds to
  a VideoMAEModel's weights (fresh there; seeded here, for the test to set
  in vidjax's fresh head): `classifier.weight` [400, 64], `.bias` [400]."""
  width = VIDEOMAE["width"]
  shapes = {"classifier.weight": (400, width), "classifier.bias": (400,)}
  return random_tensors(shapes, seed)


def videomae_video(seed: int = 1, frames: int = 16) -> np.ndarray:
  """The normalised input video, float32 [2, FRAMES, 32, 32, 3]."""
  size = VIDEOMAE["size"]
  rng = np.random.default_rng(seed)
  return rng.standard_normal((2, frames, size, size, 3)).astype(np.float32)


def layer_norm(x, sd, name, eps):
  """torch's layer_norm with `sd`'s NAME.weight and NAME.bias."""
  import torch

  return torch.nn.functional.layer_norm(
    x, x.shape[-1:], sd[f"{name}.weight"], sd[f"{name}.bias"], eps
  )


def attention(x, weight, bias, out_w, out_b, heads, causal=False):
  """Multi-head self-attention of x [B, N, D] with fused q/k/v weights."""
  import torch

  F = torch.nn.functional
  q, k, v = (
    t.unflatten(-1, (heads, -1)).transpose(1, 2)
    for t in F.linear(x, weight, bias).chunk(3, -1)
  )
  logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
  if causal:
    logits = logits.masked_fill(
      torch.ones(logits.shape[-2:]).triu(1).bool(), float("-inf")
    )
  mixed = (logits.softmax(-1) @ v).transpose(1, 2).flatten(2)
  return F.linear(mixed, out_w, out_b)


def _sinusoid_table(length, dim):
  """VideoMAE's fixed position table: position / 10000^(2*(j//2)/dim),
  sine on even features, cosine on odd."""
  import torch

  angle = np.arange(length)[:, None] / np.power(
    10000, 2 * (np.arange(dim) // 2) / dim
  )
  return torch.tensor(
    np.where(np.arange(dim) % 2 == 0, np.sin(angle), np.cos(angle)),
    dtype=torch.float32,
  )


def _hf_embeddings(sd, config, video):
  """VideoMAEEmbeddings: video [B, T, C, H, W] -> tubelets [B, N, D] plus
  the sinusoid positions."""
  import torch

  patch = config["patch_size"]
  x = (
    torch.nn.functional.conv3d(
      video.transpose(1, 2),
      sd["videomae.embeddings.patch_embeddings.projection.weight"],
      sd["videomae.embeddings.patch_embeddings.projection.bias"],
      stride=(config["tubelet_size"], patch, patch),
    )
    .flatten(2)
    .transpose(1, 2)
  )
  return x + _sinusoid_table(x.shape[1], x.shape[-1])


def _hf_layers(x, sd, prefix, layers, heads, eps):
  """transformers' VideoMAELayers PREFIX.i on x [B, N, D]: pre-LN, exact
  GELU, no key bias."""
  import torch

  F = torch.nn.functional
  width = x.shape[-1]
  for i in range(layers):
    p = f"{prefix}.{i}."
    a = p + "attention.attention."
    h = layer_norm(x, sd, p + "layernorm_before", eps)
    weight = torch.cat(
      [sd[a + f"{n}.weight"] for n in ("query", "key", "value")]
    )
    bias = torch.cat([sd[a + "q_bias"], torch.zeros(width), sd[a + "v_bias"]])
    x = x + attention(
      h,
      weight,
      bias,
      sd[p + "attention.output.dense.weight"],
      sd[p + "attention.output.dense.bias"],
      heads,
    )
    h = F.gelu(
      F.linear(
        layer_norm(x, sd, p + "layernorm_after", eps),
        sd[p + "intermediate.dense.weight"],
        sd[p + "intermediate.dense.bias"],
      )
    )
    x = x + F.linear(
      h, sd[p + "output.dense.weight"], sd[p + "output.dense.bias"]
    )
  return x


def _hf_encoder(sd, config, x):
  """VideoMAEModel's encoder (and last LayerNorm where not mean pooling)."""
  eps = config["layer_norm_eps"]
  x = _hf_layers(
    x,
    sd,
    "videomae.encoder.layer",
    config["num_hidden_layers"],
    config["num_attention_heads"],
    eps,
  )
  if config["use_mean_pooling"]:
    return x
  return layer_norm(x, sd, "videomae.layernorm", eps)


def hf_videomae_logits(sd, config, video):
  """transformers' VideoMAEForVideoClassification.forward, written from
  `modeling_videomae.py`: sd torch tensors, video [B, T, C, H, W]."""
  import torch

  x = _hf_encoder(sd, config, _hf_embeddings(sd, config, video))
  if config["use_mean_pooling"]:
    x = layer_norm(x.mean(1), sd, "fc_norm", 1e-5)  # nn.LayerNorm's default
  else:
    x = x[:, 0]
  return torch.nn.functional.linear(
    x, sd["classifier.weight"], sd["classifier.bias"]
  )


def hf_videomae_predictions(sd, config, video, mask):
  """transformers' VideoMAEForPreTraining.forward's logits [B, M, t*p*p*3]
  (the masked tubes' pixels) for video [B, T, C, H, W] and bool_masked_pos
  `mask` [B, N] (M masked in each clip)."""
  import torch

  batch, width = len(video), config["decoder_hidden_size"]
  keep = lambda x, where: x[where].reshape(batch, -1, x.shape[-1])
  x = keep(_hf_embeddings(sd, config, video), ~mask)
  x = _hf_encoder(sd, config, x)
  x = torch.nn.functional.linear(x, sd["encoder_to_decoder.weight"])
  positions = _sinusoid_table(mask.shape[1], width).expand(batch, -1, -1)
  x = torch.cat(
    [x + keep(positions, ~mask), sd["mask_token"] + keep(positions, mask)], 1
  )
  x = _hf_layers(
    x,
    sd,
    "decoder.decoder_layers",
    config["decoder_num_hidden_layers"],
    config["decoder_num_attention_heads"],
    config["layer_norm_eps"],
  )
  # The decoder's own nn.LayerNorm(decoder_hidden_size): eps 1e-5.
  x = layer_norm(x[:, -int(mask[0].sum()) :], sd, "decoder.norm", 1e-5)
  return torch.nn.functional.linear(
    x, sd["decoder.head.weight"], sd["decoder.head.bias"]
  )


def hf_videomae_outputs() -> dict[str, np.ndarray]:
  """transformers' outputs of `hf_videomae`'s directories:

  `token` / `mean`: a VideoMAEForVideoClassification's logits, float32
  [2, 400], of `videomae_video()` (the last LayerNorm, token 0; fc_norm of
  the mean); `model/token` / `model/mean`: those of
  VideoMAEForVideoClassification.from_pretrained of a VideoMAEModel's
  directory (with `hf_videomae_head()` and a fresh fc_norm: 1, 0), on the
  4-frame `videomae_video(frames=4)`; `pretraining`: a
  VideoMAEForPreTraining's predictions, float32 [2, 6, 1536], of that clip
  under `MASK`.
  """
  import torch

  def tensors(sd):
    return {k: torch.from_numpy(v) for k, v in sd.items()}

  def video(frames):
    clip = videomae_video(frames=frames)
    return torch.from_numpy(clip).permute(0, 1, 4, 2, 3)

  out = {}
  width = VIDEOMAE["width"]
  fresh_norm = {"fc_norm.weight": np.ones(width, np.float32)}
  fresh_norm["fc_norm.bias"] = np.zeros(width, np.float32)
  with torch.no_grad():
    for pool, mean_pooling in (("token", False), ("mean", True)):
      sd, config = hf_videomae(mean_pooling)
      out[pool] = hf_videomae_logits(tensors(sd), config, video(16)).numpy()
      sd, config = hf_videomae(mean_pooling, architecture="model")
      sd = {f"videomae.{k}": v for k, v in sd.items()}  # from_pretrained's
      sd.update(hf_videomae_head(), **(fresh_norm if mean_pooling else {}))
      logits = hf_videomae_logits(tensors(sd), config, video(4))
      out[f"model/{pool}"] = logits.numpy()
    sd, config = hf_videomae(False, architecture="pretraining")
    out["pretraining"] = hf_videomae_predictions(
      tensors(sd), config, video(4), torch.from_numpy(MASK)
    ).numpy()
  return out


# ------------------------------------------------ torch's tensors and files


def temporal_resize() -> dict[str, np.ndarray]:
  """AVION's inflate_positional_embeds (load_temporal_fix='bilinear'): a
  4-frame temporal table float32 [4, 6] resized by torch's bilinear
  interpolate to `resized` float32 [16, 6]."""
  import torch

  table = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
  resized = torch.nn.functional.interpolate(
    torch.from_numpy(table)[None, None], (16, 6), mode="bilinear"
  )[0, 0].numpy()
  return {"table": table, "resized": resized}


def bf16_safetensors(path: Path | None = None) -> dict[str, np.ndarray]:
  """bfloat16 tensors as Hugging Face's save_pretrained writes them
  (safetensors.torch) to `path`; returns torch's own float32 of each."""
  import torch

  generator = torch.Generator().manual_seed(0)
  tensors = {
    "visual.proj": torch.randn(3, 5, generator=generator).bfloat16(),
    "visual.class_embedding": torch.randn(5, generator=generator).bfloat16(),
  }
  if path is not None:
    from safetensors.torch import save_file

    save_file(tensors, path, metadata={"format": "pt"})
  return {k: v.float().numpy() for k, v in tensors.items()}


# ---------------------------------------- python -m vidjax.export, in torch

# The :debug runs exported (tests/debug_runs.py): run name -> (format,
# --frames). A 4-frame video CLIP and a CLIP classifier to AVION's layout,
# the CLIP as it embeds one frame to OpenCLIP's, VideoMAE's pretraining and
# classifier to Hugging Face's.
EXPORTS = {
  "avion_clip": ("clip_vitb16_ego4d", "avion", None),
  "avion_cls": ("ek100_cls_ft", "avion", None),
  "open_clip": ("clip_vitb16_ego4d", "open_clip", 1),
  "hf_pretrain": ("videomae_vitb_k400_pretrain", "hf", None),
  "hf_cls": ("k400_ft", "hf", None),
}


def export_inputs(seed: int = 5) -> dict[str, np.ndarray]:
  """The clip and captions the exports are run on: `video` float32[1, 4,
  64, 64, 3] (normalised pixels, frames last as vidjax takes them),
  `tokens` int64[2, 77] (the end-of-text id 1023 the largest), `mask`
  bool[1, 32]: 14 of each time step's 16 tubes masked, as tubes."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((2, 77), np.int64)
  tokens[:, :6] = rng.integers(1, 1000, (2, 6))
  tokens[:, 6] = 1023
  mask = np.zeros((2, 16), bool)
  mask[:, rng.permutation(16)[:14]] = True
  return {
    "video": rng.standard_normal((1, 4, 64, 64, 3)).astype(np.float32),
    "tokens": tokens,
    "mask": mask.reshape(1, 32),
  }


def export_fingerprint(directory) -> np.ndarray:
  """uint8[32]: the SHA-256 of an export's tensors (names and float32
  bytes): which trained weights the committed outputs were made from."""
  import hashlib

  import safetensors.numpy

  path = next(Path(directory).glob("*.safetensors"))
  digest = hashlib.sha256()
  for name, value in sorted(safetensors.numpy.load_file(path).items()):
    digest.update(name.encode() + np.asarray(value, np.float32).tobytes())
  return np.frombuffer(digest.digest(), np.uint8)


def export_outputs(directories: dict, inputs: dict) -> dict[str, np.ndarray]:
  """Each export (`EXPORTS` name -> its OUT) loaded by its format's own
  code, through its model card's snippet (AVION's model as plain torch,
  `avion_model`; OpenCLIP; transformers, offline), run on `inputs`.

  Returns:
    {NAME/OUTPUT: float32 array}: avion_clip/video and /text,
    avion_cls/logits, open_clip/image (the first frame) and /text,
    hf_cls/logits, hf_pretrain/logits (the masked tubes' pixels); [1, ...]
    for the clip, [2, ...] for the captions.
  """
  import torch

  from reference import avion_model
  from vidjax.export import card

  os.environ["HF_HUB_OFFLINE"] = "1"
  avion_model.install()
  video = torch.from_numpy(inputs["video"])
  tokens = torch.from_numpy(inputs["tokens"])
  out = {}
  for name, directory in directories.items():
    namespace = {}
    text = (Path(directory) / "README.md").read_text()
    exec(card.snippet_of(text), namespace)  # The card's own snippet.
    model = namespace["model"].float().eval()
    with torch.no_grad():
      if name.startswith("avion"):
        clip = video.permute(0, 4, 1, 2, 3)  # [B, C, T, H, W]
        if name == "avion_clip":
          out[f"{name}/video"] = model.encode_image(clip)
          out[f"{name}/text"] = model.encode_text(tokens)
        else:
          out[f"{name}/logits"] = model(clip)
      elif name == "open_clip":
        out[f"{name}/image"] = model.encode_image(
          video[:, 0].permute(0, 3, 1, 2)
        )
        out[f"{name}/text"] = model.encode_text(tokens)
      else:
        clip = video.permute(0, 1, 4, 2, 3)  # [B, T, C, H, W]
        if name == "hf_cls":
          out[f"{name}/logits"] = model(pixel_values=clip).logits
        else:
          from transformers import VideoMAEForPreTraining

          model = VideoMAEForPreTraining.from_pretrained(directory).eval()
          for line in text.splitlines():  # The card's eps settings.
            if line.startswith("- transformers builds decoder.norm"):
              model.decoder.norm.eps = float(
                line.split("set model.")[1].split()[2]
              )
          mask = torch.from_numpy(inputs["mask"])
          out[f"{name}/logits"] = model(
            pixel_values=clip, bool_masked_pos=mask
          ).logits
  return {k: v.float().numpy() for k, v in out.items()}


def exports() -> dict[str, np.ndarray]:
  """The :debug runs (trained here, as tests/debug_runs.py does, under the
  test suite's XLA flags: tests/conftest.py) exported by `python -m
  vidjax.export`, then run by their formats' own code: `export_inputs()`,
  each export's `export_fingerprint` and `export_outputs()`'s outputs."""
  import tempfile

  sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]  # tests/, vidjax
  import conftest  # noqa: F401  (the suite's XLA flags, 8 CPU devices)
  import debug_runs
  from vidjax import export

  class Temp:  # pytest's tmp_path_factory, as debug_runs uses it.
    def __init__(self, root):
      self.root, self.count = Path(root), 0

    def mktemp(self, name):
      self.count += 1
      path = self.root / f"{name}{self.count}"
      path.mkdir()
      return path

  with tempfile.TemporaryDirectory() as root:
    factory, directories = Temp(root), {}
    for name, (run, fmt, frames) in EXPORTS.items():
      workdir, _ = debug_runs.run(factory, run)
      directories[name] = Path(root) / f"export_{name}"
      export.export(workdir, directories[name], fmt, frames=frames)
    inputs = export_inputs()
    fingerprints = {
      f"{name}/fingerprint": export_fingerprint(directory)
      for name, directory in directories.items()
    }
    return {**inputs, **fingerprints, **export_outputs(directories, inputs)}


# name -> (the function, the modules it needs, the extra files it writes).
REFERENCES = {
  "openclip": (openclip, ("torch", "open_clip"), ("openclip_vit.pt",)),
  "randaugment_ops": (randaugment_ops, ("torch", "torchvision"), ()),
  "crop_fallback": (crop_fallback, ("torch", "torchvision"), ()),
  "hf_videomae": (hf_videomae_outputs, ("torch",), ()),
  "temporal_resize": (temporal_resize, ("torch",), ()),
  "bf16_safetensors": (bf16_safetensors, ("torch",), ("bf16.safetensors",)),
  "exports": (exports, ("torch", "open_clip", "transformers"), ()),
}


def committed(name: str) -> dict[str, np.ndarray]:
  """The committed outputs of reference `name` (tests/reference/NAME.npz)."""
  with np.load(HERE / f"{name}.npz") as f:
    return dict(f)


def can_run(name: str) -> bool:
  """Whether reference `name`'s implementation is importable here."""
  return all(importlib.util.find_spec(m) for m in REFERENCES[name][1])


def check_live(name: str, **tolerance) -> None:
  """Runs reference `name` again and asserts that its outputs equal the
  committed ones (same names, shapes and dtypes; values to `tolerance`,
  numpy's assert_allclose arguments, exact by default). Skips where the
  implementation is not installed, unless VIDJAX_PARITY=live (CI's parity
  step) makes that a failure."""
  import pytest

  if not can_run(name):
    needs = ", ".join(REFERENCES[name][1])
    if os.environ.get("VIDJAX_PARITY") == "live":
      pytest.fail(f"VIDJAX_PARITY=live, but {needs} cannot be imported")
    pytest.skip(f"the live reference needs {needs} (the [parity] extra)")
  want, got = committed(name), REFERENCES[name][0]()
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
    np.testing.assert_allclose(got[key], value, err_msg=key, **tolerance)


def main(names: list[str]) -> int:
  for name in names or REFERENCES:
    function, _, files = REFERENCES[name]
    arrays = function(HERE / files[0]) if files else function()
    np.savez_compressed(HERE / f"{name}.npz", **arrays)
    size = sum((HERE / f).stat().st_size for f in (f"{name}.npz", *files))
    print(f"{name}: {len(arrays)} arrays, {size / 1024:.0f} KiB")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
