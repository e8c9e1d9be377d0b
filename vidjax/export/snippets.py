"""The model card's PyTorch snippet: load the export with its format's own
code and embed (or classify) one clip.

Each snippet is about ten lines and runs as written where the format's code
is installed (AVION's repository on its path, open_clip_torch,
transformers); the parity tests run them. The clip is a random stand-in for
one normalised as the card says.
"""

from __future__ import annotations


def _avion(model, out: str) -> str:
  vision, facts = model.vision, model.facts
  blocks = vision.blocks
  act = "QuickGELU" if facts["act"][0] == "quick_gelu" else "torch.nn.GELU"
  size = (
    vision.image_size[0]
    if len(set(vision.image_size)) == 1
    else vision.image_size
  )
  frames, eps = vision.num_frames, blocks.ln_eps
  visual = (
    f"visual = VisionTransformer({size!r}, {vision.patch_size}, {blocks.width}, "
    f"{blocks.depth}, {blocks.heads}, {blocks.mlp_dim / blocks.width!r}, "
    f"num_frames={frames}, output_dim="
    f"{vision.output_dim if model.kind == 'clip' else None}, act_layer={act}, "
    f"norm_layer=partial(torch.nn.LayerNorm, eps={eps!r}), "
    "use_fast_conv1=True, use_flash_attn=True)"
  )
  lines = [
    "from functools import partial",
    "import torch",
    "from safetensors.torch import load_file",
    "from avion.models.model_clip import CLIP, VideoClassifier",
    "from avion.models.transformer import QuickGELU, TextTransformer, "
    "VisionTransformer",
    visual,
  ]
  if model.kind == "clip":
    text = model.spec.text
    lines += [
      f"textual = TextTransformer(context_length={text.context_length}, "
      f"vocab_size={text.vocab_size}, width={text.blocks.width}, "
      f"heads={text.blocks.heads}, layers={text.blocks.depth}, "
      f"output_dim={text.output_dim}, act_layer={act}, "
      f"norm_layer=partial(torch.nn.LayerNorm, eps={text.blocks.ln_eps!r}))",
      f"model = CLIP(embed_dim={vision.output_dim}, vision_model=visual, "
      "text_model=textual)",
    ]
  else:
    lines.append(
      "model = VideoClassifier(visual, dropout=0.0, "
      f"num_classes={model.spec.num_classes})"
    )
  call = "model.encode_image(video)" if model.kind == "clip" else "model(video)"
  lines += [
    f'model.load_state_dict(load_file("{out}/checkpoint_best.safetensors"))',
    'device = "cuda" if torch.cuda.is_available() else "cpu"  # flash: cuda',
    "model = model.to(device).eval()",
    f"video = torch.randn(1, 3, {frames}, {vision.image_size[0]}, "
    f"{vision.image_size[1]}, device=device)  # [B, C, T, H, W], normalised",
    'with torch.no_grad(), torch.autocast(device, enabled=device == "cuda"):',
    f"  out = {call}  # "
    + ("[1, embed_dim]" if model.kind == "clip" else "[1, classes] logits"),
  ]
  return "\n".join(lines)


def _open_clip(model, out: str) -> str:
  height, width = model.vision.image_size
  return "\n".join(
    [
      "import open_clip",
      "import torch",
      "",
      f'model = open_clip.create_model("local-dir:{out}").eval()',
      f"image = torch.randn(1, 3, {height}, {width})  # one frame, normalised",
      "with torch.no_grad():",
      "  out = model.encode_image(image)  # [1, embed_dim]",
    ]
  )


def _hf(model, notes: list[str], out: str) -> str:
  vision = model.vision
  cls = (
    "VideoMAEForVideoClassification"
    if model.kind == "classifier"
    else "VideoMAEModel"
  )
  lines = [
    "import torch",
    f"from transformers import {cls}",
    "",
    f'model = {cls}.from_pretrained("{out}").eval()',
  ]
  for note in notes:  # 'set model.X.eps = V after from_pretrained'
    if "set model." in note and (
      model.kind == "classifier" or "decoder" not in note
    ):
      lines.append(note[note.index("model.") :].split(" after ")[0])
  height, width = vision.image_size
  lines += [
    f"video = torch.randn(1, {vision.num_frames}, 3, {height}, {width})"
    "  # [B, T, C, H, W], normalised",
    "with torch.no_grad():",
    "  out = model(pixel_values=video)."
    + (
      "logits  # [1, classes]"
      if model.kind == "classifier"
      else "last_hidden_state  # [1, tokens, width]"
    ),
  ]
  return "\n".join(lines)


def _safetensors(out: str) -> str:
  return "\n".join(
    [
      "from safetensors.torch import load_file",
      "",
      f'params = load_file("{out}/params.safetensors")  # vidjax\'s names',
      "# vidjax computes with them: --config.init_from="
      + out
      + "/params.safetensors",
      "print(sorted(params)[:5])",
    ]
  )


def snippet(model, fmt: str, out: str, notes: list[str] = ()) -> str:
  """The snippet for `model` exported as `fmt` to `out`."""
  if fmt == "avion":
    return _avion(model, out)
  if fmt == "open_clip":
    return _open_clip(model, out)
  if fmt == "hf":
    return _hf(model, list(notes), out)
  return _safetensors(out)
