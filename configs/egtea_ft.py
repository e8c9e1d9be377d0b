r"""EGTEA Gaze+ action recognition: fine-tune the CLIP video tower (LaViLa's).

What it trains: the video ViT-B/16 of the contrastive dual encoder
(`clip_vitb16_ego4d.py`, or AVION's / LaViLa's released checkpoint) with a
new linear head over EGTEA's 106 actions, on 16-frame clips of frames 2
apart (`--clip-length 16 --clip-stride 2`), random-resized crops (scale 0.5-1)
and flips, label smoothing 0.1, head dropout 0.5, drop path 0.1, SGD with
momentum 0.9 and weight decay 4e-5 (`--use-sgd --wd 4e-5`) for 100 epochs of
the 8,299 clips of train_split1.txt (1 of warmup, cosine to 1e-5; global
batch 128). Evaluation every 5 epochs on the 2,022 clips of test_split1.txt,
10 clips x 3 crops per clip (`--num-clips 10 --num-crops 3`): `eval/top1`
and `eval/mean_class_acc` (the mean of the confusion matrix's per-class
recall, EGTEA's "mean Acc."); the best checkpoint by mean class accuracy.

Files, as EGTEA Gaze+ ships them: `cropped_clips/<video_id>/<clip_name>.mp4`
(e.g. OP01-R01-PastaSalad/OP01-R01-PastaSalad-1002316-1004005-F024051-F024101.mp4),
and beside each other `train_split1.txt`, `test_split1.txt` (`clip_name
action verb noun`, 1-based) and `action_idx.txt` (`Action_Name idx`; read
from beside the split file, or `data.classes`).

Data, once (each clip becomes a video named by its clip name):

    python -m vidjax.data.chunk /data/EGTEA/cropped_clips /data/egtea_chunks \
        --chunk-seconds 15 --short-side 320 --workers 16

One 8-GPU machine:

    E=/data/EGTEA
    python -m vidjax.main --config configs/egtea_ft.py --workdir /runs/egtea_ft \
        --config.init_from=/runs/clip_vitb16_ego4d \
        --config.data.root=/data/egtea_chunks \
        --config.data.train_annotations=$E/train_split1.txt \
        --config.data.eval_annotations=$E/test_split1.txt

`init_from`: a vidjax pretraining (its best checkpoint, else the latest), a
step directory, or AVION's / LaViLa's released dual encoder (`checkpoint_best
.pt` layout: 'module.'-prefixed state dict); its vision tower becomes the
backbone, its temporal table is resized to 16 frames, the head starts fresh.
Zero-shot EGTEA, no training: `configs/clip_vitb16_ego4d.py --mode eval`
(README, "Benchmarks").

LaViLa's reported numbers (not ours), EGTEA mean class accuracy: 70.1
(TSF-B) / 76.0 (TSF-L), fine-tuned from its epoch-5 / epoch-3 Ego4D
pretraining (docs/MODEL_ZOO.md). Not reproduced here: LaViLa trains the
backbone at 0.1x the head's learning rate (`--lr-multiplier-on-backbone`),
and averages the views' logits before the softmax (vidjax averages the
views' softmax scores, as AVION).

`configs/egtea_ft.py:debug`: the same task, layout and multi-view
evaluation, tiny, 2 steps on the synthetic corpus's EGTEA files (CPU).
"""

import ml_collections

from vidjax.config import defaults, recipe

EGTEA_ACTIONS = 106


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("classification")
  c.data.update(
    format="egtea",
    num_frames=16,  # --clip-length 16
    sampling="stride",
    stride=2,  # --clip-stride 2
    hflip=0.5,  # RandomHorizontalFlip(p=0.5)
    eval_clips=10,  # --num-clips 10
    eval_crops=3,  # --num-crops 3
    workers=16,
    threads=4,
  )
  c.model.update(
    backbone="clip",
    tubelet=1,
    num_classes=EGTEA_ACTIONS,
    drop_path=0.1,  # --drop-path-rate 0.1
    head_dropout=0.5,  # --dropout-ratio 0.5
    head_init_scale=0.5,
    remat="save_dots_and_attention",
  )
  # 100 epochs, 1 of warmup, 16 clips per GPU on 8 GPUs.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["egtea"],
    epochs=100,
    warmup_epochs=1,
    batch_size=8 * 16,
  )
  c.optim.update(
    name="sgd",
    momentum=0.9,  # betas[0]
    lr=3e-3,  # --lr 3e-3
    min_lr=1e-5,  # --lr-end 1e-5
    weight_decay=4e-5,  # --wd 4e-5
    no_decay_names=("spatial_pos",),
  )
  c.augment.label_smoothing = 0.1
  c.eval.update(every_steps=5 * steps_per_epoch, batch_size=8 * 16)
  c.checkpoint.update(
    every_steps=5 * steps_per_epoch, best_metric="eval/mean_class_acc"
  )
  if "debug" in variants:
    recipe.debug_on_synthetic(c, eval_clips=2, eval_crops=3)
    recipe.tiny_model(c, num_classes=48)  # The corpus's 48 classes.
  return c
