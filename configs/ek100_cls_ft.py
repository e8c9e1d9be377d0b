r"""EPIC-Kitchens-100 action recognition: fine-tune the CLIP video tower.

What it trains: the video ViT-B/16 of the contrastive dual encoder
(`clip_vitb16_ego4d.py`) with a new linear head over the 3,806 EK-100
actions (verb:noun pairs of the train + validation CSVs), on 16-frame clips,
with mixup 0.8 / cutmix 1.0, label smoothing 0.1, head dropout 0.5 and drop
path 0.1, SGD with momentum 0.9 for 100 epochs of the 67,217 training clips
(global batch 512). Evaluation on the 9,668
validation clips: action top-1/top-5 and mean class accuracy (`eval/top1`,
`eval/top5`, `eval/mean_class_acc`) and the verb and noun accuracies
marginalised from the action scores (`eval/verb_top1`, `eval/noun_top1`,
`eval/verb_mean_class_acc`, `eval/noun_mean_class_acc`); see below.

Files, in the names the datasets ship them: the EK-100 videos (P01_01.MP4,
...) and epic-kitchens-100-annotations' EPIC_100_train.csv and
EPIC_100_validation.csv (both: action ids come from their union).

Data, once (the same chunks as `ek100_mir_ft.py`):

    python -m vidjax.data.chunk /data/EPIC-KITCHENS /data/ek100_chunks \
        --chunk-seconds 15 --short-side 320 --fps 30 --workers 16

One 8-GPU machine (batch 64 per GPU, as AVION):

    A=/data/epic-kitchens-100-annotations
    python -m vidjax.main --config configs/ek100_cls_ft.py \
        --workdir /runs/ek100_cls_ft \
        --config.init_from=/runs/clip_vitb16_ego4d \
        --config.data.root=/data/ek100_chunks \
        --config.data.train_annotations=$A/EPIC_100_train.csv \
        --config.data.eval_annotations=$A/EPIC_100_validation.csv

All paths are the user's to give (they default to ''). `init_from` is the
contrastive checkpoint (AVION: --pretrain-model): a vidjax workdir (its best
checkpoint, else the latest), a step directory, or AVION's released
`checkpoint_best.pt`. Its vision tower becomes the backbone (the text tower,
the projection and the temperature are dropped), its 4-frame temporal
embedding is interpolated to 16 frames, and the head starts fresh (std
0.01); WORKDIR/init_from.json lists all of it. Both CSVs are needed: action
ids come from their union, sorted as LaViLa/AVION number them. The run
keeps its best checkpoint by action top-1, as AVION does; `--mode eval
--config.init_from=avion_finetune_cls_lavila_vitb_best.pt` evaluates
AVION's released classifier.

The backbone computes what the checkpoint was trained with (its
activation and LayerNorm eps, read from it: an AVION checkpoint's exact
GELU and eps 1e-6). Matching AVION's code exactly: its classifier gives
every block the same drop-path rate
(`--config.model.drop_path_schedule=uniform`; the default ramps linearly
from 0, as the ViT recipe it cites) and, on a vidjax pretraining of
OpenAI's weights, runs exact GELU and eps 1e-6 on the QuickGELU weights
(`--config.model.act=gelu --config.model.ln_eps=1e-6
--config.init_allow_mismatch=True`).

Evaluation, as AVION's: action `eval/top1` (its Acc@1), `eval/top5`,
`eval/mean_class_acc` (its Mean Acc.), and from the action probabilities
summed per verb and per noun (a verb or noun in no action takes action 0's,
as AVION's `marginalize`) `eval/verb_top1` and `eval/noun_top1` (its Verb
and Noun Acc@1) and `eval/verb_mean_class_acc`, `eval/noun_mean_class_acc`
(its mean class accuracy, which it computes but does not print).

AVION's reported numbers (not ours), ViT-B, EK-100 validation, top-1
verb / noun / action: 67.9 / 57.6 / 47.3 from its baseline Ego4D
pretraining, 70.0 / 59.4 / 49.5 from the LLM-augmented (LaViLa) one
(docs/MODEL_ZOO.md). 8x NVIDIA A5000 (24 GB).

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch command) and
scripts/main_lavila_finetune_cls.py (argparse defaults and the lr scaling
by batch / 128); see `get_config`.
`configs/ek100_cls_ft.py:debug`: the same task, model and annotation format,
tiny, 2 steps on the synthetic corpus (CPU).
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
    # GPU memory at 64 clips per GPU, by remat policy (upper bounds,
    # `python -m benchmarks.memory --config configs/ek100_cls_ft.py`):
    # none 134 GiB, save_dots_and_attention 41, save_attention 14, full 10
    # (AVION's --grad-checkpointing, for its 24 GB cards). The default fits
    # 80 GB GPUs; on 24-48 GB use "save_attention" (no second attention
    # pass, the costly part at 16 frames).
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
