"""AVION's CLIP and video classifier written as plain torch, for the parity
tests of `python -m vidjax.export --format avion`.

The classes, their constructor arguments and their parameter names are
AVION's (avion/models/transformer.py, model_clip.py) as run with
`--use-flash-attn --use-fast-conv1`: the vision blocks' flash-attention
`attn.Wqkv` / `attn.out_proj` and `mlp.fc1` / `mlp.fc2`, the patch
embedding a Linear over (channel, row, column), the text tower in
nn.MultiheadAttention's names. Flash attention is computed here by plain
softmax attention in float32 (flash_attn needs a GPU); the rest is what
AVION computes: class token plus positions, a temporal table repeated over
each frame's patches, ln_pre, pre-norm blocks, ln_post on the class token,
the projection; the text tower's causal mask, ln_final and its argmax
(end-of-text) token.

`install()` registers these as `avion.models.transformer` and
`avion.models.model_clip`, so that an export's model-card snippet, written
for AVION's repository, runs against them.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
import sys
import types

import torch
from torch import nn
import torch.nn.functional as F


class QuickGELU(nn.Module):
  def forward(self, x):
    return x * torch.sigmoid(1.702 * x)


class FlashMHA(nn.Module):
  """flash_attn's MHA as AVION builds it: one Wqkv Linear, out_proj."""

  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.Wqkv = nn.Linear(width, 3 * width)
    self.out_proj = nn.Linear(width, width)

  def forward(self, x):  # [B, L, D]
    batch, length, width = x.shape
    qkv = self.Wqkv(x).reshape(batch, length, 3, self.heads, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # [B, H, L, d] each
    out = F.scaled_dot_product_attention(q, k, v)
    return self.out_proj(out.transpose(1, 2).reshape(batch, length, width))


class FlashMlp(nn.Module):
  def __init__(self, width: int, hidden: int, activation: nn.Module):
    super().__init__()
    self.fc1, self.activation = nn.Linear(width, hidden), activation
    self.fc2 = nn.Linear(hidden, width)

  def forward(self, x):
    return self.fc2(self.activation(self.fc1(x)))


class ResidualAttentionBlock(nn.Module):
  def __init__(self, width, heads, mlp_ratio, act_layer, norm_layer, flash):
    super().__init__()
    self.flash = flash
    self.ln_1, self.ln_2 = norm_layer(width), norm_layer(width)
    hidden = int(width * mlp_ratio)
    if flash:
      self.attn = FlashMHA(width, heads)
      self.mlp = FlashMlp(width, hidden, act_layer())
    else:
      self.attn = nn.MultiheadAttention(width, heads)
      self.mlp = nn.Sequential(
        OrderedDict(
          c_fc=nn.Linear(width, hidden),
          gelu=act_layer(),
          c_proj=nn.Linear(hidden, width),
        )
      )

  def forward(self, x, attn_mask=None):  # flash: [B, L, D]; else [L, B, D]
    y = self.ln_1(x)
    if self.flash:
      x = x + self.attn(y)
    else:
      x = x + self.attn(y, y, y, need_weights=False, attn_mask=attn_mask)[0]
    return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
  def __init__(
    self, width, layers, heads, mlp_ratio, act_layer, norm_layer, flash
  ):
    super().__init__()
    self.resblocks = nn.ModuleList(
      ResidualAttentionBlock(
        width, heads, mlp_ratio, act_layer, norm_layer, flash
      )
      for _ in range(layers)
    )

  def forward(self, x, attn_mask=None):
    for block in self.resblocks:
      x = block(x, attn_mask=attn_mask)
    return x


class VisionTransformer(nn.Module):
  def __init__(
    self,
    image_size,
    patch_size,
    width,
    layers,
    heads,
    mlp_ratio,
    num_frames=1,
    output_dim=None,
    act_layer=nn.GELU,
    norm_layer=None,
    use_fast_conv1=False,
    use_flash_attn=False,
    **unused,
  ):
    super().__init__()
    assert use_fast_conv1 and use_flash_attn, "the layout exported"
    norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)  # AVION's
    size = image_size if isinstance(image_size, int) else image_size[0]
    self.patch, self.width, self.num_frames = patch_size, width, num_frames
    self.conv1 = nn.Linear(3 * patch_size**2, width, bias=False)
    self.class_embedding = nn.Parameter(torch.zeros(width))
    grid = (size // patch_size) ** 2
    self.positional_embedding = nn.Parameter(torch.zeros(grid + 1, width))
    if num_frames > 1:
      self.temporal_embedding = nn.Parameter(torch.zeros(num_frames, width))
    self.ln_pre = norm_layer(width)
    self.transformer = Transformer(
      width, layers, heads, mlp_ratio, act_layer, norm_layer, True
    )
    self.ln_post = norm_layer(width)
    self.image_projection = (
      nn.Parameter(torch.zeros(width, output_dim)) if output_dim else None
    )

  def forward(self, x):  # [B, 3, T, H, W]
    batch, channels, frames, height, width = x.shape
    p = self.patch
    x = x.reshape(batch, channels, frames, height // p, p, width // p, p)
    x = x.permute(0, 2, 3, 5, 1, 4, 6).reshape(batch, -1, channels * p * p)
    x = self.conv1(x)
    cls = self.class_embedding + torch.zeros(batch, 1, self.width)
    x = torch.cat([cls, x], dim=1)
    pos = self.positional_embedding
    if self.num_frames > 1:
      patches = pos[1:].repeat(self.num_frames, 1)
      per_frame = (height // p) * (width // p)
      patches = patches + self.temporal_embedding.repeat_interleave(
        per_frame, 0
      )
      pos = torch.cat([pos[:1], patches])
    x = self.transformer(self.ln_pre(x + pos))
    x = self.ln_post(x[:, 0])
    return x if self.image_projection is None else x @ self.image_projection


class TextTransformer(nn.Module):
  def __init__(
    self,
    context_length=77,
    vocab_size=49408,
    width=512,
    heads=8,
    layers=12,
    output_dim=None,
    act_layer=nn.GELU,
    norm_layer=nn.LayerNorm,
    **unused,
  ):
    super().__init__()
    self.token_embedding = nn.Embedding(vocab_size, width)
    self.positional_embedding = nn.Parameter(torch.zeros(context_length, width))
    self.transformer = Transformer(
      width, layers, heads, 4.0, act_layer, norm_layer, False
    )
    self.ln_final = norm_layer(width)
    self.text_projection = nn.Parameter(torch.zeros(width, output_dim))
    mask = torch.full((context_length, context_length), float("-inf"))
    self.register_buffer("attn_mask", mask.triu_(1), persistent=False)

  def forward(self, text):  # int[B, L]
    x = self.token_embedding(text) + self.positional_embedding
    x = self.transformer(x.permute(1, 0, 2), attn_mask=self.attn_mask)
    x = self.ln_final(x.permute(1, 0, 2))
    return (
      x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection
    )


class CLIP(nn.Module):
  def __init__(self, embed_dim, vision_model, text_model, **unused):
    super().__init__()
    self.visual, self.textual = vision_model, text_model
    self.logit_scale = nn.Parameter(torch.ones([]))

  def encode_image(self, image):
    return self.visual(image)

  def encode_text(self, text):
    return self.textual(text)


class VideoClassifier(nn.Module):
  def __init__(self, vision_model, dropout, num_classes, **unused):
    super().__init__()
    self.visual = vision_model
    self.visual.image_projection = None
    self.dropout = nn.Dropout(dropout)
    self.fc_cls = nn.Linear(vision_model.width, num_classes)

  def forward(self, image):
    return self.fc_cls(self.dropout(self.visual(image)))


def install() -> None:
  """Registers this module as AVION's `avion.models.transformer` and
  `avion.models.model_clip`."""
  here = sys.modules[__name__]
  for name in ("avion", "avion.models"):
    sys.modules.setdefault(name, types.ModuleType(name))
  sys.modules["avion.models.transformer"] = here
  sys.modules["avion.models.model_clip"] = here
