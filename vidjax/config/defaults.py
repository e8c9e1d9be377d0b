"""Every config section's defaults and every allowed value: the ground floor.

This module imports ml_collections only, so that loading a recipe
(configs/*.py, through `vidjax.config`) starts no runtime: no jax, flax,
grain, orbax or PyAV. The modules that read a section document its keys and
take their defaults and choices from here:

  base_config(task)   every key a run of `task` reads (top-level keys:
                      `vidjax.config.recipe`'s docstring)
  data_config()       `config.data`      (`vidjax.data.pipeline`)
  model_config(name)  `config.model`     (`vidjax.models`)
  optim_config()      `config.optim`     (`vidjax.optim`)
  augment_config()    `config.augment`   (`vidjax.augment`)
  eval_set(format)    one of `config.eval.sets` (`vidjax.evaluation.eval_sets`)

`CHOICES` maps each key that names one of a few choices to the allowed
values (`vidjax.config.validate` checks them); the modules that implement
the choices key their tables by the same names.
"""

from __future__ import annotations

import math
import re

import ml_collections
from ml_collections import config_dict

# ------------------------------------------------------------------ facts
# The model each task trains (`model.name`); video-text tasks train a CLIP
# and read text.
TASK_MODELS = {
  "contrastive": "clip",
  "retrieval": "clip",
  "mae": "videomae",
  "classification": "classifier",
  # Masked alignment to a frozen CLIP teacher (UMT): `vidjax.tasks.distill`.
  "distill": "umt",
}
TASKS = tuple(TASK_MODELS)
MODELS = ("clip", "videomae", "classifier", "umt")

# CLIP's tokenizer and text tower: tokens per text (start and end tokens
# included), and ids in its vocabulary (`vidjax.data.tokenizer`).
CONTEXT_LENGTH = 77
VOCAB_SIZE = 49408
INIT_LOGIT_SCALE = math.log(1 / 0.07)  # CLIP's temperature at init.

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# VideoMAE and most Kinetics recipes use the ImageNet statistics.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Vision sizes: name -> (width, depth, heads); MLP width 4x. 'Ti' is for
# tests and demos. `model.variant` is NAME/PATCH, e.g. 'B/16'.
VARIANTS = {
  "Ti": (192, 12, 3),
  "S": (384, 12, 6),
  "B": (768, 12, 12),
  "L": (1024, 24, 16),
  "H": (1280, 32, 16),
}

# ---------------------------------------------------------------- choices
DATA_FORMATS = (
  "jsonl",
  "ego4d",
  "ek100_cls",
  "ek100_mir",
  "kinetics",
  "kinetics_list",
  "egomcq",
  "egtea",
  "charades_ego",
  "charades_ego_trimmed",
)
# `eval.kind`: '' scores a set by its task's metrics; 'zeroshot' classifies
# it with text prompts (`vidjax.evaluation.zeroshot`), 'egomcq' picks EgoMCQ's clips
# (`vidjax.evaluation.scoreboard`). `eval.views`: how a clip's views are reduced.
EVAL_KINDS = ("", "zeroshot", "egomcq")
VIEW_REDUCTIONS = ("mean", "max")
EK100_LABELS = ("action", "verb", "noun")  # `data.label` of 'ek100_cls'.
SAMPLINGS = ("segment", "stride")
CROPS = ("random_resized", "multi_scale", "center")
DTYPES = ("auto", "bfloat16", "float32", "float16")  # 'auto': bf16 on GPU.
ATTENTION = ("auto", "xla", "cudnn")
REMAT_POLICIES = (
  "none",
  "full",
  "save_attention",
  "save_dots_and_attention",
  "dots_saveable",
  "dots_with_no_batch_dims_saveable",
)
DROP_PATH_SCHEDULES = ("linear", "uniform")
ACTIVATIONS = ("quick_gelu", "gelu")
BACKBONES = ("videomae", "clip")  # A classifier's backbone style.
POOLS = ("", "mean", "token")  # '': the backbone's default.
MASK_KINDS = ("random", "tube")
# The tokens a distilled student keeps, per frame (`vidjax.models.umt`):
# drawn by the teacher's class-token attention (UMT), its top ones, or at
# random; and the alignment loss on them (UMT's `clip_loss_type`).
SELECTIONS = ("attention", "topk", "random")
ALIGN_LOSSES = ("l2", "mse", "smooth_l1")
OPTIMIZERS = ("adamw", "sgd", "lion")
SCHEDULES = ("cosine", "constant")
ERASE_MODES = ("pixel", "rand", "const")
BEST_MODES = ("max", "min")
MODES = ("train", "eval")  # `python -m vidjax.main --mode`.
# `loss.name` of the retrieval task (`vidjax.tasks.retrieval.LOSSES`):
# AVION's max-margin ranking, the same with each margin scaled by the
# positive's relevancy, and SMS; the last two read every in-batch pair's
# relevancy from the training matrix's classes.
LOSSES = ("max_margin", "relevancy_max_margin", "sms")
# `model.probe` of a classifier (`vidjax.models.videomae.Classifier`): none
# (fine-tuning), the head on the frozen averaged patch tokens, or an attentive probe
# over the frozen patch tokens (V-JEPA 2's evaluations).
PROBES = ("", "linear", "attentive")


def choices(config) -> dict[str, tuple]:
  """The keys naming one of a few choices, with the allowed values."""
  classifier = config.get("model", {}).get("name") == "classifier"
  return {
    "task": TASKS,
    "data.format": DATA_FORMATS,
    "data.label": EK100_LABELS,
    "data.sampling": SAMPLINGS,
    "data.crop": CROPS,
    "model.name": MODELS,
    "model.dtype": DTYPES,
    "model.residual_dtype": DTYPES,
    "model.norm_dtype": DTYPES,
    "model.attention": ATTENTION,
    "model.remat": REMAT_POLICIES,
    "model.drop_path_schedule": DROP_PATH_SCHEDULES,
    # A classifier's '' is its backbone's own activation.
    "model.act": ACTIVATIONS + (("",) if classifier else ()),
    "model.backbone": BACKBONES,
    "model.pool": POOLS,
    "model.mask_kind": MASK_KINDS,
    "model.select": SELECTIONS,
    "loss.align": ALIGN_LOSSES,
    "optim.name": OPTIMIZERS,
    "optim.schedule": SCHEDULES,
    "augment.erase_mode": ERASE_MODES,
    "checkpoint.best_mode": BEST_MODES,
    "eval.kind": EVAL_KINDS,
    "eval.views": VIEW_REDUCTIONS,
    "loss.name": LOSSES,
    "model.probe": PROBES,
  }


def needs_text(task: str) -> bool:
  """Whether `task`'s batches carry text tokens (its model is a CLIP)."""
  return TASK_MODELS.get(task) == "clip"


def needs_relevancy(config) -> bool:
  """Whether the training batches carry the classes of every in-batch
  pair's relevancy (EK-100 MIR with a relevancy-aware `loss.name`)."""
  loss = config.get("loss", {}).get("name", "max_margin")
  return config.get("task") == "retrieval" and loss != "max_margin"


def parse_variant(variant: str) -> dict:
  """'B/16' -> dict(width=768, depth=12, heads=12, mlp_dim=3072, patch_size=16).

  Raises:
    ValueError: not NAME/PATCH with a NAME of `VARIANTS`.
  """
  match = re.fullmatch(r"(\w+)/(\d+)", variant)
  if not match or match.group(1) not in VARIANTS:
    raise ValueError(
      f"model variant must look like 'B/16' with a size in "
      f"{sorted(VARIANTS)}, got {variant!r}"
    )
  width, depth, heads = VARIANTS[match.group(1)]
  return dict(
    width=width,
    depth=depth,
    heads=heads,
    mlp_dim=4 * width,
    patch_size=int(match.group(2)),
  )


# --------------------------------------------------------------- sections
def data_config() -> ml_collections.ConfigDict:
  """`config.data` (keys: `vidjax.data.pipeline`)."""
  return ml_collections.ConfigDict(
    dict(
      root="",
      train_annotations="",
      eval_annotations="",
      format="jsonl",
      label="action",
      allow_pickle=False,
      vocab="",
      classes="",
      train_sentences="",
      train_relevancy="",
      positive_threshold=0.1,
      # Noun classes per clip or caption a batch carries for the in-batch
      # relevancy of the relevancy-aware losses (`loss.name`; EK-100 MIR):
      # a longer set stops the start-up, naming this key.
      max_nouns=16,
      num_frames=16,
      sampling="segment",
      stride=4,
      size=224,
      crop="random_resized",
      crop_scale=(0.5, 1.0),
      hflip=0.5,
      eval_clips=1,
      eval_crops=1,
      repeats=1,
      repeat_canvas=(0, 0),
      workers=0,
      threads=0,
      worker_buffer=8,
      device_prefetch=2,
      stall_warn_s=60.0,
      max_skip_fraction=0.25,
      max_attempts=10,
      max_bad_row_fraction=0.01,
      synthetic=ml_collections.ConfigDict(
        dict(
          enabled=False,
          num_videos=96,
          segments_per_video=2,
          segment_seconds=3.0,
          height=96,
          width=128,
          seed=0,
          relevancy=False,
        )
      ),
    )
  )


def model_config(name: str = "clip") -> ml_collections.ConfigDict:
  """`config.model` of model `name`, AVION's defaults (keys: `vidjax.models`)."""
  if name not in MODELS:
    raise ValueError(f"model name must be one of {MODELS}, got {name!r}")
  videomae_like = name != "clip"
  config = ml_collections.ConfigDict(
    dict(
      name=name,
      variant="B/16",
      width=config_dict.placeholder(int),
      depth=config_dict.placeholder(int),
      heads=config_dict.placeholder(int),
      mlp_dim=config_dict.placeholder(int),
      image_size=224,
      num_frames=16,
      tubelet=2 if videomae_like else 1,
      dtype="auto",
      residual_dtype="float32",
      norm_dtype="float32",
      attention="auto",
      remat="none",
      scan=False,
      drop_path=0.0 if name == "videomae" else 0.1,
      drop_path_schedule="linear",
      act={"clip": "quick_gelu", "videomae": "gelu", "classifier": ""}.get(
        name, "gelu"
      ),
      ln_eps={
        "clip": 1e-5,
        "videomae": 1e-6,
        "umt": 1e-6,
        "classifier": config_dict.placeholder(float),
      }[name],
    )
  )
  if name == "clip":
    config.embed_dim = 512
    config.text = ml_collections.ConfigDict(
      dict(
        vocab_size=VOCAB_SIZE,
        context_length=CONTEXT_LENGTH,
        width=512,
        heads=8,
        layers=12,
        ln_eps=1e-5,
      )
    )
    config.logit_scale_init = INIT_LOGIT_SCALE
    config.learn_logit_scale = True
    config.mask_ratio = 0.0
    config.mask_kind = "random"
  elif name == "videomae":
    config.mask_ratio = 0.9
    config.decoder = ml_collections.ConfigDict(
      dict(width=384, depth=4, heads=6, ln_eps=config_dict.placeholder(float))
    )
    config.norm_pix_loss = True
  elif name == "umt":
    _umt_config(config)
  else:
    config.num_classes = 400
    config.backbone = "videomae"
    config.pool = ""
    config.head_ln_eps = config_dict.placeholder(float)
    config.head_dropout = 0.0
    config.head_init_scale = 0.001
    # '' fine-tunes the whole model; 'linear' or 'attentive' trains a probe
    # on the frozen encoder's features, cached once (`PROBES`).
    config.probe = ""
  return config


def _umt_config(config: ml_collections.ConfigDict) -> None:
  """The distilled student's keys (UMT's ViT-B; `vidjax.models.umt`)."""
  config.update(tubelet=1, drop_path=0.1)  # UMT: tubelet 1, drop path 0.1.
  config.mask_ratio = 0.8  # Of each frame's patches; the teacher picks.
  config.select = "attention"  # `SELECTIONS`.
  config.align_layers = 6  # The last K layers of both, aligned pairwise.
  # The frozen CLIP vision tower, applied per frame at (H/p) x p_teacher
  # pixels. `source` is what `init_from` reads (a vidjax run too); its
  # sizes, activation and eps are settled from it at start-up
  # (`vidjax.checkpoints.teacher`), and `checksum` records its weights.
  config.teacher = ml_collections.ConfigDict(
    dict(
      source="",
      allow_pickle=False,
      checksum="",
      variant="B/16",
      width=config_dict.placeholder(int),
      depth=config_dict.placeholder(int),
      heads=config_dict.placeholder(int),
      mlp_dim=config_dict.placeholder(int),
      embed_dim=512,
      act="quick_gelu",
      ln_eps=1e-5,
      dtype="auto",  # bfloat16 on GPU: the teacher runs in it.
    )
  )


def optim_config() -> ml_collections.ConfigDict:
  """`config.optim` (keys: `vidjax.optim`)."""
  return ml_collections.ConfigDict(
    dict(
      name="adamw",
      lr=1e-4,
      min_lr=1e-6,
      warmup_steps=0,
      warmup_lr=0.0,  # Where the warmup starts (AVION's --lr-start).
      # Parameter path prefixes left as they are (e.g. a probe's frozen
      # "encoder"): no update, no weight decay, no optimizer state.
      frozen=(),
      schedule="cosine",
      weight_decay=0.05,
      no_decay_names=(
        "pos_embed",
        "spatial_pos",
        "temporal_pos",
        "class_token",
        "cls_token",
        "mask_token",
        "embedding",
        "logit_scale",
      ),
      b1=0.9,
      b2=0.98,
      eps=1e-6,
      momentum=0.9,
      nesterov=False,
      clip_grad_norm=0.0,
      layer_decay=1.0,
      num_layers=0,
      layer_regex=r"(?:^|[/.])(?:blocks|layers|resblocks)[/_.]?(\d+)(?:[/.]|$)",
      embed_regex=r"embed|_pos\b|class_token|cls_token|mask_token",
      mu_dtype="",
    )
  )


def augment_config() -> ml_collections.ConfigDict:
  """`config.augment`: every key `vidjax.augment.make_augment` takes from a
  config (the task adds num_classes, mask_ratio, tubelet, patch and the
  model's dtype)."""
  return ml_collections.ConfigDict(
    dict(
      mean=CLIP_MEAN,
      std=CLIP_STD,
      mixup_alpha=0.0,
      cutmix_alpha=0.0,
      switch_prob=0.5,
      mix_prob=1.0,
      label_smoothing=0.0,
      mix_groups=1,
      randaugment_layers=0,
      randaugment_magnitude=7.0,
      randaugment_prob=0.5,
      randaugment_std=0.5,
      erase_prob=0.0,
      erase_mode="pixel",
    )
  )


# One fact, one key: these keys are references to the data's, so that a
# change of the data's frames or size (on the command line too) moves them.
REFERENCES = {
  "model.num_frames": "data.num_frames",
  "model.image_size": "data.size",
}


def base_config(task: str) -> ml_collections.ConfigDict:
  """Every key a run of `task` reads, with its default.

  The top-level keys and the small sections are described in
  `vidjax.config.recipe`'s docstring; the others where they are read.
  """
  if task not in TASK_MODELS:
    raise ValueError(f"task must be one of {list(TASK_MODELS)}, got {task!r}")
  c = ml_collections.ConfigDict(
    dict(
      seed=0,
      task=task,
      total_steps=0,
      total_epochs=0.0,
      unmask_fraction=0.0,
      unmask_lr=0.0,
      unmask_warmup_steps=0,
      unmask_accum_steps=0,
      batch_size=64,
      accum_steps=1,
      fsdp=1,
      resume="",
      init_from="",
      init_allow_pickle=False,
      init_keep=(),
      init_allow_mismatch=False,
      overrides=(),
      peak_tflops=0.0,
      device_memory_gib=0.0,
    )
  )
  c.data = data_config()
  c.model = model_config(TASK_MODELS[task])
  for key, ref in REFERENCES.items():
    (section, name), (ref_section, ref_name) = key.split("."), ref.split(".")
    c[section][name] = c[ref_section].get_ref(ref_name)
  c.optim = optim_config()
  c.augment = augment_config()
  # The retrieval task's loss (`LOSSES`), its margin (at a relevancy gap
  # of 1 for the relevancy-aware ones) and SMS's threshold for pairs as
  # relevant as the positive.
  c.loss = ml_collections.ConfigDict(
    dict(name="max_margin", margin=0.2, threshold=0.1)
  )
  if task == "distill":
    c.loss.align = "l2"  # `ALIGN_LOSSES`: UMT's 2 - 2 cos.
  c.eval = ml_collections.ConfigDict(
    dict(
      every_steps=0,
      every_epochs=0.0,
      batch_size=64,
      relevancy="",
      sentences="",
      save_embeddings=False,
      kind="",
      templates=("{}",),
      views="mean",
      sets=ml_collections.ConfigDict(),
    )
  )
  c.checkpoint = ml_collections.ConfigDict(
    dict(
      every_steps=1000,
      every_epochs=0.0,
      keep=2,
      async_save=True,
      best_metric="",
      best_mode="max",
    )
  )
  # plots: WORKDIR/plots/*.png drawn at the end of a run (False: none;
  # `python -m vidjax.plot WORKDIR` draws them at any time).
  c.log = ml_collections.ConfigDict(dict(every_steps=10, plots=True))
  return c


def eval_set(data_format: str, **data) -> ml_collections.ConfigDict:
  """A named evaluation set for `eval.sets` (see `vidjax.evaluation.eval_sets`).

  Args:
    data_format: its annotation format (`data.format`).
    **data: other `config.data` keys it changes.

  Returns:
    The set: its `data` keys (the format, the other keys given, `root`: ''
    for the run's `data.root`, and `eval_annotations`, the user's to give:
    '' skips the set) and its own `relevancy` and `sentences` ('' for none).
  """
  return ml_collections.ConfigDict(
    dict(
      data=ml_collections.ConfigDict(
        dict(format=data_format, root="", eval_annotations="", **data)
      ),
      relevancy="",
      sentences="",
    )
  )


# The field's benchmarks as named sets (`benchmark_set`): format, kind,
# view reduction (LaViLa's protocols) and the data keys they change.
BENCHMARKS = {
  "egomcq": ("egomcq", "egomcq", "mean", {}),
  "egtea": ("egtea", "zeroshot", "max", {"classes": ""}),
  "charades_ego": (
    "charades_ego",
    "zeroshot",
    "mean",
    {"classes": "", "sampling": "segment"},
  ),
  "ek100_cls": (
    "ek100_cls",
    "zeroshot",
    "mean",
    {"label": "action", "train_annotations": ""},
  ),
}


def benchmark_set(name: str) -> ml_collections.ConfigDict:
  """One of the field's benchmarks as a named set (`vidjax.evaluation.scoreboard`):
  `eval_set` of its format with its `kind`, `views` and `templates`; its
  files ('' until given: skipped) are the user's."""
  data_format, kind, views, data = BENCHMARKS[name]
  spec = eval_set(data_format, **data)
  spec.update(dict(kind=kind, views=views, templates=("{}",)))
  return spec
