r"""EGTEA Gaze+ action recognition: fine-tune the CLIP video tower (LaViLa's).

The video ViT-B/16 of `clip_vitb16_ego4d.py` (or AVION's / LaViLa's released
dual encoder) with a new linear head over EGTEA's 106 actions, on 16-frame
clips of frames 2 apart, SGD for 100 epochs of the 8,299 clips of
train_split1.txt (global batch 128). Evaluated every 5 epochs on the 2,022
clips of test_split1.txt, 10 clips x 3 crops each: `eval/top1` and
`eval/mean_class_acc` (EGTEA's "mean Acc."), the best checkpoint by the
latter. `:debug`: tiny, 2 steps on the synthetic corpus's EGTEA files (CPU).

One 8-GPU machine (the files and the chunks: docs/recipes.md):

    E=/data/EGTEA
    python -m vidjax.main --config configs/egtea_ft.py --workdir /runs/egtea_ft \
        --config.init_from=/runs/clip_vitb16_ego4d \
        --config.data.root=/data/egtea_chunks \
        --config.data.train_annotations=$E/train_split1.txt \
        --config.data.eval_annotations=$E/test_split1.txt

Zero-shot EGTEA, no training: docs/scoreboard.md.

LaViLa's reported numbers (not ours), EGTEA mean class accuracy: 70.1
(TSF-B) / 76.0 (TSF-L), fine-tuned from its epoch-5 / epoch-3 Ego4D
pretraining (its MODEL_ZOO.md). Not reproduced here: LaViLa's backbone at
0.1x the head's learning rate, and its views' logits averaged before the
softmax (vidjax averages the softmax scores, as AVION). The numbers to
beat per benchmark, a probe on a frozen encoder too: docs/scoreboard.md.
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
    # 12 GiB per GPU at 16 clips (`python -m benchmarks.memory --config
    # configs/egtea_ft.py`: 29 / 101 / 182 clips fit 24 / 80 / 141 GB).
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
