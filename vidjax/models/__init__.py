"""Models: video ViT, CLIP, VideoMAE, classifier; built from a config.

`build_model(config, rngs=...)` builds the model of `config` (usually
`config.model`) through its spec (`spec.from_config`: one frozen
description, each module given its part whole). It reads these keys
(`vidjax.config.defaults.model_config(name)` has all of them, with their
defaults):

Every model
  name          'clip' | 'videomae' | 'classifier' | 'umt'.
  variant       vision size and patch, e.g. 'Ti/16', 'S/16', 'B/16', 'L/14'
                (sizes in `defaults.VARIANTS`; MLP width 4x).
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
                fits what GPU memory (`python -m benchmarks.memory`).
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
  command line (`vidjax.weights.facts`).
'clip'
  embed_dim     joint embedding size (512 for B/16).
  text.vocab_size 49408 and text.context_length 77 (CLIP's tokenizer
                makes texts of this many tokens), text.width 512,
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
  decoder.width 384, decoder.depth 4, decoder.heads 6; decoder.ln_eps the
                eps of the decoder's last LayerNorm (None: ln_eps).
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
'umt' (a student distilled from a frozen CLIP: `umt.py`)
  mask_ratio    the share of each frame's patches the student drops (0.8).
  select        'attention' (UMT: drawn by the teacher's class-token
                attention), 'topk' or 'random'.
  align_layers  K, the last blocks of student and teacher aligned (6).
  teacher       the CLIP vision tower: source (what init_from reads),
                allow_pickle, checksum, variant, width, depth, heads,
                mlp_dim, embed_dim, act, ln_eps, dtype; settled from the
                source at start-up (`vidjax.checkpoints.teacher`).

Dropout and drop path draw from the 'dropout' stream of the `rngs` given at
construction, or from `rngs=` given at call time (nnx.Rngs or a key).
"""

from __future__ import annotations

from flax import nnx
import ml_collections

from vidjax.base import internals
from vidjax.models import spec as spec_lib
from vidjax.models.clip import CLIP
from vidjax.models.spec import resolve_dtype
from vidjax.models.umt import UMT
from vidjax.models.videomae import Classifier, VideoMAE
from vidjax.models.vit import VisionTransformer

__all__ = [
  "CLIP",
  "Classifier",
  "VideoMAE",
  "VisionTransformer",
  "UMT",
  "MODELS",
  "build_model",
  "resolve_dtype",
]

# The model registry: `model.name` (the names of `defaults.MODELS`, whose
# `model_config` has their keys) -> the class, built from its spec.
MODELS = {
  "clip": CLIP,
  "videomae": VideoMAE,
  "classifier": Classifier,
  "umt": UMT,
}
_NAMES = {
  spec_lib.ClipSpec: "clip",
  spec_lib.VideoMAESpec: "videomae",
  spec_lib.ClassifierSpec: "classifier",
  spec_lib.UMTSpec: "umt",
}


def build_model(
  config: ml_collections.ConfigDict | spec_lib.ModelSpec, *, rngs: nnx.Rngs
):
  """Builds the model of a `config.model` ('clip', 'videomae',
  'classifier' or 'umt'), or of a spec (`spec.from_config`, or a variant of one)."""
  spec = config if type(config) in _NAMES else spec_lib.from_config(config)
  # Built under jax.jit or nnx.eval_shape, Flax's random draws would make
  # construction quadratic in the model's size (see internals).
  with internals.tracer_sharding_without_explanation():
    return MODELS[_NAMES[type(spec)]](spec, rngs=rngs)
