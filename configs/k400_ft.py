r"""Kinetics-400 classification: fine-tune the VideoMAE ViT-B/16 encoder.

The encoder of `videomae_vitb_k400_pretrain.py` with a mean pool, a
LayerNorm and a new 400-way head, on 16-frame stride-4 clips, with
RandAugment, random erasing, mixup/cutmix, label smoothing, drop path and
layer-wise lr decay 0.75, AdamW for 100 epochs of the ~240k training clips
(global batch 256). Evaluated on 5 clips x 3 crops per validation video
(`eval/top1`, `eval/top5`); the best checkpoint by top-1. `:debug`: tiny, 2
steps on the synthetic corpus (JSONL, 48 classes, CPU).

One 8-GPU machine (batch 32 per GPU, as AVION; the pretraining's chunks and
annotations, or AVION's video lists: docs/recipes.md):

    python -m vidjax.main --config configs/k400_ft.py \
        --workdir /runs/k400_ft \
        --config.init_from=/runs/videomae_vitb_k400 \
        --config.data.root=/data/k400_chunks \
        --config.data.train_annotations=/data/k400/annotations/train.csv \
        --config.data.eval_annotations=/data/k400/annotations/val.csv

`total_steps` assumes 240,000 training clips: `--config.total_epochs=100`
counts 100 epochs of yours instead.

AVION's reported numbers (not ours): Kinetics-400 top-1 / top-5 80.1 / 94.5
(its README; its MODEL_ZOO.md: 80.0 / 94.5) with 5 x 3 views, from its
800-epoch Lion pretraining; 8x NVIDIA A5000 for fine-tuning.
Hyper-parameters: AVION's MODEL_ZOO.md and scripts/main_videomae_finetune.py
(lr scaled by batch / 256, test_num_segment=5, test_num_crop=3). Best
at ViT-B we cite: UMT's 87.4 (`umt_vitb_k400_pretrain.py`, then this;
docs/scoreboard.md).
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("classification")
  # init_from: the VideoMAE pretraining checkpoint (AVION: --finetune).

  c.data.update(
    format="kinetics",
    sampling="stride",  # 16 x 4 (stride 4), 224 px
    # RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3/4, 4/3)) + flip.
    crop_scale=(0.08, 1.0),
    eval_clips=5,
    eval_crops=3,  # test_num_segment=5, test_num_crop=3
    workers=16,
    threads=4,
  )

  # The VideoMAE ViT-B/16 (tubelets of 2), mean pool + fc_norm, no
  # --grad-checkpointing in AVION's command. GPU memory at 32 clips per GPU
  # (1.0-1.3x what XLA compiles; `python -m benchmarks.memory --config
  # configs/k400_ft.py`, with the most clips per GPU that fit
  # 24 / 80 / 141 GB): none 28 GiB (24 / 84 / 152 clips),
  # save_dots_and_attention 12 (60 / 209 / 376), save_attention 5: on
  # 24 GB cards use "save_dots_and_attention".
  c.model.update(
    num_classes=400,  # --nb-classes 400
    drop_path=0.1,  # --drop-path-rate 0.1
    head_dropout=0.0,  # --fc-drop-rate 0
    head_init_scale=0.001,
  )  # init_scale=0.001

  # 100 epochs (5 of warmup) at 32 clips per GPU on 8 GPUs: 937 steps each.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["k400"],
    epochs=100,
    warmup_epochs=5,
    batch_size=8 * 32,
  )
  c.optim.update(
    # AVION scales lr and lr_end by batch / 256; cosine after the warmup.
    lr=1.5e-3 * c.batch_size / 256,
    warmup_lr=1e-6 * c.batch_size / 256,  # --lr-start, scaled as lr
    min_lr=1e-6 * c.batch_size / 256,
    b2=0.999,
    eps=1e-8,
    layer_decay=0.75,
  )  # num_layers 0: inferred (12 blocks)

  c.augment.update(
    # Flipped at decode time (data.hflip), not here.
    mean=defaults.IMAGENET_MEAN,
    std=defaults.IMAGENET_STD,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    label_smoothing=0.1,
    # pytorchvideo's RandAugment(magnitude=7, num_layers=4) (prob 0.5,
    # level std 0.5) and RandomErasing(--reprob 0.25, mode='pixel',
    # max_count=1, cube=True), as AVION's VideoClsDataset.
    randaugment_layers=4,
    erase_prob=0.25,
  )
  c.eval.update(
    every_steps=10 * steps_per_epoch, batch_size=240
  )  # 16 clips x 15 views
  c.checkpoint.update(
    every_steps=5 * steps_per_epoch, best_metric="eval/top1"
  )  # AVION: best top-1

  if "debug" in variants:
    _debug(c)
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU, with the
  recipe's augmentations (RandAugment, random erasing, mixup/cutmix).

  The corpus has no Kinetics CSV; its JSONL has 48 classes. The backbone
  is every :debug recipe's: `videomae_vitb_k400_pretrain.py:debug`
  checkpoints initialise it.
  """
  recipe.debug_on_synthetic(c, format="jsonl", stride=4)
  recipe.tiny_model(c, num_classes=48)
