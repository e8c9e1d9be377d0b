r"""VideoMAE ViT-B/16 pretraining on Kinetics-400: AVION's VideoMAE recipe.

A ViT-B/16 encoder on 16-frame clips (stride 4, tubelets of 2) that sees
10% of the tubes, and a 4-layer decoder that reconstructs the masked tubes'
normalised pixels, from scratch, 800 epochs of the ~240k Kinetics-400
training clips with Lion, global batch 256. Evaluated by the same loss on
held-out clips (`eval/loss`); fine-tune the result with `configs/k400_ft.py`
(`--config.init_from=/runs/videomae_vitb_k400`). `:debug`: tiny, 2 steps on
the synthetic corpus (JSONL, CPU).

One 8-GPU machine (AVION: 64 per GPU x 4 GPUs; 32 x 8 keeps its global batch
of 256; the chunks and annotations: docs/recipes.md):

    python -m vidjax.main --config configs/videomae_vitb_k400_pretrain.py \
        --workdir /runs/videomae_vitb_k400 \
        --config.data.root=/data/k400_chunks \
        --config.data.train_annotations=/data/k400/annotations/train.csv \
        --config.data.eval_annotations=/data/k400/annotations/val.csv

One GPU with 16 cores (an H200): add `--config.data.repeats=4`, 4 views of
each decoded clip (MAE-ST's repeated sampling; why: docs/recipes.md).
`total_steps` assumes 240,000 training clips: `--config.total_epochs=800`
counts 800 epochs of yours instead.

AVION's reported numbers (not ours): after fine-tuning (`k400_ft.py`),
Kinetics-400 top-1 / top-5 80.1 / 94.5 (its README; its MODEL_ZOO.md: 80.0 /
94.5), against VideoMAE's 80.0 / 94.4; 800 epochs took 583 GPU-hours on 4x
NVIDIA A5000. Hyper-parameters: AVION's MODEL_ZOO.md (--optimizer lion,
--batch-size 64 on 4 GPUs) and scripts/main_videomae_pretrain.py (lr scaled
by batch / 256); see `get_config`.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("mae")
  # From scratch (pretrained=False).

  c.data.update(
    format="kinetics",
    sampling="stride",  # 16 x 4 (stride 4), 224 px
    # Fused GroupMultiScaleCrop(224, [1, .875, .75, .66]) + flip 0.5.
    crop="multi_scale",
    workers=16,
    threads=4,
  )

  # ViT-B/16 on tubelets of 2, exact GELU; --mask-ratio 0.9,
  # --normalize-target, --drop-path-rate 0; a 384-wide 4-layer decoder.
  # No --grad-checkpointing in AVION's command: at 32 clips per GPU the
  # step holds 8.4 GiB (1.0-1.3x what XLA compiles; up to 89 / 306 / 550
  # clips per GPU fit 24 / 80 / 141 GB: `python -m benchmarks.memory
  # --config configs/videomae_vitb_k400_pretrain.py`), the encoder seeing
  # 10% of the tokens.

  # 800 epochs (40 of warmup) at 32 clips per GPU on 8 GPUs (AVION's 4 x
  # 64): 937 steps each.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["k400"],
    epochs=800,
    warmup_epochs=40,
    batch_size=8 * 32,
  )
  c.optim.update(
    name="lion",
    b2=0.95,
    # AVION scales lr and lr_end by batch / 256; cosine after the warmup.
    lr=1.5e-4 * c.batch_size / 256,
    warmup_lr=1e-6 * c.batch_size / 256,  # --lr-start, scaled as lr
    min_lr=1e-5 * c.batch_size / 256,
    # AVION decays the decoder's mask token (a [1, 1, D] tensor there).
    no_decay_names=tuple(
      n for n in c.optim.no_decay_names if n != "mask_token"
    ),
  )

  c.augment.update(  # Flipped at decode time (data.hflip).
    mean=defaults.IMAGENET_MEAN, std=defaults.IMAGENET_STD
  )
  c.eval.update(every_steps=100 * steps_per_epoch, batch_size=256)
  # No best checkpoint: AVION fine-tunes from the last (800th) epoch.
  c.checkpoint.every_steps = 5 * steps_per_epoch
  c.log.every_steps = 50

  if "debug" in variants:
    _debug(c)
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU.

  The corpus has no Kinetics CSV; its JSONL carries the same fields. The
  backbone is every :debug recipe's, so these checkpoints initialise
  `k400_ft.py:debug`.
  """
  recipe.debug_on_synthetic(c, format="jsonl", stride=4)
  recipe.tiny_model(c)
  c.model.decoder.update(width=32, depth=1, heads=2)
  # No warmup: 2 steps that train, so the checkpoint is not the init.
  c.optim.warmup_steps = 0
