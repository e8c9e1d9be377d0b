r"""EPIC-Kitchens-100 action recognition: fine-tune the CLIP video tower.

The video ViT-B/16 of `clip_vitb16_ego4d.py` with a new linear head over the
3,806 EK-100 actions (verb:noun pairs of the train + validation CSVs), on
16-frame clips, mixup/cutmix, label smoothing, SGD for 100 epochs of the
67,217 training clips (global batch 512). Evaluated on the 9,668 validation
clips: `eval/top1`, `eval/top5`, `eval/mean_class_acc`, and the verb and noun
accuracies marginalised from the action scores (`eval/verb_top1`,
`eval/noun_top1`, ...), as AVION computes them (docs/avion.md); the best
checkpoint by top-1. `:debug`: tiny, 2 steps on the synthetic corpus (CPU).

One 8-GPU machine (batch 64 per GPU, as AVION; the EK-100 chunks of
`ek100_mir_ft.py`, both CSVs: docs/recipes.md):

    A=/data/epic-kitchens-100-annotations
    python -m vidjax.main --config configs/ek100_cls_ft.py \
        --workdir /runs/ek100_cls_ft \
        --config.init_from=/runs/clip_vitb16_ego4d \
        --config.data.root=/data/ek100_chunks \
        --config.data.train_annotations=$A/EPIC_100_train.csv \
        --config.data.eval_annotations=$A/EPIC_100_validation.csv

AVION's released classifier, no training: `--mode eval
--config.init_from=avion_finetune_cls_lavila_vitb_best.pt`. Matching AVION's
code exactly (`--config.model.drop_path_schedule=uniform`): docs/avion.md.

AVION's reported numbers (not ours), ViT-B, EK-100 validation, top-1 verb /
noun / action: 67.9 / 57.6 / 47.3 from its baseline Ego4D pretraining, 70.0
/ 59.4 / 49.5 from the LLM-augmented (LaViLa) one (its MODEL_ZOO.md), on 8x
NVIDIA A5000 (24 GB). Hyper-parameters: AVION's MODEL_ZOO.md and
scripts/main_lavila_finetune_cls.py (lr scaled by batch / 128). The
numbers to beat per benchmark: docs/scoreboard.md.
"""

import ml_collections

from vidjax.config import defaults, recipe

EK100_ACTIONS = 3_806  # verb:noun pairs in EPIC_100_{train,validation}.csv.


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("classification")
  # init_from: the contrastive checkpoint (AVION: --pretrain-model).

  c.data.update(
    format="ek100_cls",  # Labels: the actions.
    # --clip-length 16 segment frames, RandomResizedCrop(224, scale=(0.5,
    # 1.0)), no flip; one centre view at eval (--num-clips 1 --num-crops 1).
    num_frames=16,
    hflip=0.0,
    workers=16,
    threads=4,
  )

  c.model.update(
    backbone="clip",  # class token after the final LayerNorm (pool '')
    tubelet=1,
    num_classes=EK100_ACTIONS,
    drop_path=0.1,  # --drop-path-rate 0.1
    head_dropout=0.5,  # --dropout-rate 0.5
    head_init_scale=0.5,  # fc_cls ~ N(0, 0.01) = 0.02 x 0.5
    # GPU memory at 64 clips per GPU, by remat policy (1.0-1.3x what XLA
    # compiles; `python -m benchmarks.memory --config
    # configs/ek100_cls_ft.py`, with the most clips per GPU that fit
    # 24 / 80 / 141 GB): none 108 GiB (42 / 75 clips on 80 / 141 GB),
    # save_dots_and_attention 45 (29 / 101 / 182), save_attention 19
    # (74 / 255 / 457), full 15 (AVION's --grad-checkpointing). The default
    # fits 80 GB GPUs; on 24-48 GB use "save_attention" (no second
    # attention pass, the costly part at 16 frames).
    remat="save_dots_and_attention",
  )

  # 100 epochs (2 of warmup) at 64 clips per GPU on 8 GPUs: 131 steps each.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["ek100"],
    epochs=100,
    warmup_epochs=2,
    batch_size=8 * 64,
  )
  c.optim.update(
    name="sgd",
    momentum=0.9,  # momentum = betas[0], no nesterov
    # AVION scales lr and lr_end by batch / 128; cosine after the warmup.
    lr=3e-3 * c.batch_size / 128,  # 0.012
    warmup_lr=1e-6 * c.batch_size / 128,  # --lr-start, scaled as lr: 4e-6
    min_lr=1e-5 * c.batch_size / 128,  # 4e-5
    weight_decay=4e-5,
    no_decay_names=("spatial_pos",),
  )

  c.augment.update(  # CLIP mean/std (--norm-style openai).
    mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1
  )
  c.eval.update(
    every_steps=5 * steps_per_epoch,  # --eval-freq 5 (epochs)
    batch_size=512,
  )
  c.checkpoint.update(
    every_steps=5 * steps_per_epoch, best_metric="eval/top1"
  )  # AVION: best action top-1

  if "debug" in variants:
    _debug(c)
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU.

  The corpus's `ek100_{train,val}.csv` are in the EK-100 action layout
  (verb = motion, noun = coloured shape). The backbone is every :debug
  recipe's: `clip_vitb16_ego4d.py:debug` checkpoints initialise it.
  """
  recipe.debug_on_synthetic(c)
  # The head must have exactly as many classes as the action map of the
  # 8-video seed-0 corpus has verb:noun pairs (14), for the verb/noun scores.
  recipe.tiny_model(c, num_classes=14)
