"""Models: video ViT, CLIP, VideoMAE, classifier; built from a config.

`build_model(config, rngs=...)` reads these keys of `config` (a ConfigDict,
usually `config.model`; `default_model_config(name)` has all of them):

Every model
  name          'clip' | 'videomae' | 'classifier'.
  variant       vision size and patch, e.g. 'Ti/16', 'S/16', 'B/16', 'L/14'
                (sizes in `vit.VARIANTS`; MLP width 4x).
  width, depth, heads, mlp_dim
                None, or an int that overrides the variant (tiny test models).
  image_size    input side in pixels (224).
  num_frames    frames per clip (16).
  tubelet       frames per patch: 1 for CLIP-style, 2 for VideoMAE.
  dtype         compute dtype: 'bfloat16', 'float32', or 'auto' (bfloat16 on
                GPU, float32 elsewhere). Parameters are always float32.
  residual_dtype  dtype of the residual stream between blocks: 'float32'
                (default, as PyTorch autocast), 'bfloat16', or 'auto'.
  norm_dtype    the blocks' LayerNorms: 'float32' (default: statistics
                and normalisation in float32, the output in the compute
                dtype), 'bfloat16' (all of it in bfloat16), or 'auto'. The
                MLP's activation runs in the compute dtype.
  attention     'auto' | 'xla' | 'cudnn' (see attention.py).
  remat         per-block rematerialisation (what the backward pass keeps):
                'none' (everything), 'full' (only block inputs),
                'save_attention' (attention outputs and cuDNN's softmax
                statistics), 'save_dots_and_attention' (those and every
                matmul output), 'dots_saveable' (matmul outputs only),
                'dots_with_no_batch_dims_saveable'. Each recipe says which
                fits what GPU memory (`python -m vidjax.bench.memory`).
  scan          scan over blocks (faster compiles, params stacked by depth).
  drop_path     stochastic depth at the last block.
  drop_path_schedule  'linear' (from 0 at the first block, timm/VideoMAE)
                or 'uniform' (every block at drop_path: AVION's CLIP
                classifier).
  act           'quick_gelu' (OpenAI CLIP) or 'gelu' (exact: AVION, VideoMAE);
                for 'classifier', '' takes the backbone's.
  ln_eps        LayerNorm eps of the vision tower (encoder): 1e-5 for CLIP
                (OpenAI's), 1e-6 for VideoMAE; for 'classifier', None takes
                the backbone's.
  `act`, the eps and the classifier's pooling are what the weights were
  trained with: `config.init_from`'s source sets the ones not given on the
  command line (`vidjax.models.facts`).
'clip'
  embed_dim     joint embedding size (512 for B/16).
  text.vocab_size 49408, text.context_length 77, text.width 512,
  text.heads 8, text.layers 12, text.ln_eps 1e-5.
  logit_scale_init  log(1/temperature) at init (log(1/0.07)).
  learn_logit_scale whether it is trained.
  mask_ratio    masked training (FLIP): the share of each clip's patch
                tokens the video tower drops in training, after their
                positions are added (0: none; evaluation and the text
                tower always see every token). The run's last
                `unmask_fraction` of steps train on every token.
  mask_kind     'random' (anywhere in the clip) or 'tube' (the same
                spatial positions in every frame).
'videomae'
  mask_ratio    tube-masking ratio; fixes the masked count per clip.
  decoder.width 384, decoder.depth 4, decoder.heads 6.
  norm_pix_loss per-patch normalised targets.
'classifier'
  num_classes   head size.
  backbone      'videomae' (sinusoid positions, no class token, mean pool)
                or 'clip' (class token, learned positions, token pool).
  pool          '' (the backbone's default), 'mean' or 'token' (the first
                token: the class token, or VideoMAE's first patch token).
  head_ln_eps   eps of the pooled LayerNorm (VideoMAE's fc_norm, CLIP's
                ln_post); None: ln_eps.
  head_dropout  dropout before the head.
  head_init_scale  head init std is 0.02 x this (VideoMAE uses 0.001).

Dropout and drop path draw from the 'dropout' stream of the `rngs` given at
construction, or from `rngs=` given at call time (nnx.Rngs or a key).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from ml_collections import config_dict

from vidjax.models.clip import CLIP, INIT_LOGIT_SCALE
from vidjax.models.videomae import Classifier, VideoMAE
from vidjax.models.transformer import drop_path_rates
from vidjax.models.vit import VARIANTS, VisionTransformer, parse_variant

__all__ = ['CLIP', 'Classifier', 'VARIANTS', 'VideoMAE', 'VisionTransformer',
           'build_model', 'default_model_config', 'model_kwargs',
           'resolve_dtype']

MODEL_NAMES = ('clip', 'videomae', 'classifier')
# `model.dtype` and `model.residual_dtype` ('auto': bfloat16 on GPU).
DTYPES = ('auto', 'bfloat16', 'float32', 'float16')


def default_model_config(name: str = 'clip') -> ml_collections.ConfigDict:
  """Every key `build_model` reads for model `name`, with AVION's defaults."""
  if name not in MODEL_NAMES:
    raise ValueError(f'model name must be one of {MODEL_NAMES}, got {name!r}')
  videomae_like = name != 'clip'
  config = ml_collections.ConfigDict(dict(
      name=name,
      variant='B/16',
      width=config_dict.placeholder(int),
      depth=config_dict.placeholder(int),
      heads=config_dict.placeholder(int),
      mlp_dim=config_dict.placeholder(int),
      image_size=224,
      num_frames=16,
      tubelet=2 if videomae_like else 1,
      dtype='auto',
      residual_dtype='float32',
      norm_dtype='float32',
      attention='auto',
      remat='none',
      scan=False,
      drop_path=0.0 if name == 'videomae' else 0.1,
      drop_path_schedule='linear',
      act={'clip': 'quick_gelu', 'videomae': 'gelu', 'classifier': ''}[name],
      ln_eps={'clip': 1e-5, 'videomae': 1e-6,
              'classifier': config_dict.placeholder(float)}[name],
  ))
  if name == 'clip':
    config.embed_dim = 512
    config.text = ml_collections.ConfigDict(dict(
        vocab_size=49408, context_length=77, width=512, heads=8, layers=12,
        ln_eps=1e-5))
    config.logit_scale_init = INIT_LOGIT_SCALE
    config.learn_logit_scale = True
    config.mask_ratio = 0.0
    config.mask_kind = 'random'
  elif name == 'videomae':
    config.mask_ratio = 0.9
    config.decoder = ml_collections.ConfigDict(dict(width=384, depth=4,
                                                    heads=6))
    config.norm_pix_loss = True
  else:
    config.num_classes = 400
    config.backbone = 'videomae'
    config.pool = ''
    config.head_ln_eps = config_dict.placeholder(float)
    config.head_dropout = 0.0
    config.head_init_scale = 0.001
  return config


def resolve_dtype(name: str):
  """'bfloat16' | 'float32' | 'float16' | 'auto' -> a jnp dtype."""
  if name == 'auto':
    return jnp.bfloat16 if jax.default_backend() == 'gpu' else jnp.float32
  if name not in DTYPES:
    raise ValueError(f'model dtype must be one of {DTYPES}, got {name!r}')
  return jnp.dtype(name).type


def model_kwargs(config: ml_collections.ConfigDict) -> dict:
  """The constructor keyword arguments (without rngs) for `config.name`."""
  sizes = parse_variant(config.variant)
  for key in ('width', 'depth', 'heads', 'mlp_dim'):
    if config[key] is not None:
      sizes[key] = config[key]
  if config.mlp_dim is None:
    sizes['mlp_dim'] = 4 * sizes['width']
  common = dict(
      patch_size=sizes['patch_size'], image_size=config.image_size,
      num_frames=config.num_frames, tubelet=config.tubelet,
      drop_path=drop_path_rates(config.drop_path, sizes['depth'],
                                config.drop_path_schedule),
      attention=config.attention, remat=config.remat, scan=config.scan,
      dtype=resolve_dtype(config.dtype),
      residual_dtype=resolve_dtype(config.residual_dtype),
      norm_dtype=resolve_dtype(config.norm_dtype))
  vision = dict(width=sizes['width'], depth=sizes['depth'],
                heads=sizes['heads'], mlp_dim=sizes['mlp_dim'])
  if config.name == 'clip':
    text = config.text
    return dict(
        common, act=config.act, norm_eps=config.ln_eps,
        text_norm_eps=config.text.ln_eps, embed_dim=config.embed_dim,
        **{f'vision_{key}': value for key, value in vision.items()},
        vocab_size=text.vocab_size, context_length=text.context_length,
        text_width=text.width, text_heads=text.heads, text_depth=text.layers,
        logit_scale_init=config.logit_scale_init,
        learn_logit_scale=config.learn_logit_scale,
        mask_ratio=config.mask_ratio, mask_kind=config.mask_kind)
  if config.name == 'videomae':
    return dict(
        common, **vision, act=config.act, norm_eps=config.ln_eps,
        decoder_width=config.decoder.width,
        decoder_depth=config.decoder.depth,
        decoder_heads=config.decoder.heads, mask_ratio=config.mask_ratio,
        norm_pix_loss=config.norm_pix_loss)
  if config.name == 'classifier':
    return dict(
        common, **vision, num_classes=config.num_classes,
        act=config.act or None, norm_eps=config.ln_eps,
        head_norm_eps=config.head_ln_eps, backbone=config.backbone,
        pool=config.pool or None,
        head_dropout=config.head_dropout,
        head_init_scale=config.head_init_scale)
  raise ValueError(f'config.name must be one of {MODEL_NAMES}, '
                   f'got {config.name!r}')


def build_model(config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
  """Builds the model `config.name` ('clip', 'videomae' or 'classifier')."""
  kwargs = model_kwargs(config)
  model_class = {'clip': CLIP, 'videomae': VideoMAE,
                 'classifier': Classifier}[config.name]
  return model_class(**kwargs, rngs=rngs)
