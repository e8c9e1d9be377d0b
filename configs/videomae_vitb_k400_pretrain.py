r"""VideoMAE ViT-B/16 pretraining on Kinetics-400: AVION's VideoMAE recipe.

What it trains: a ViT-B/16 encoder on 16-frame clips (stride 4, tubelets of 2
frames) that sees 10% of the tubes (tube masking, ratio 0.9), and a 4-layer
384-wide decoder that reconstructs the masked tubes' per-patch-normalised
pixels (MSE), from scratch, for 800 epochs of the ~240k Kinetics-400
training clips with Lion (AVION's choice), global batch 256, cosine decay
after 40 warmup epochs. Evaluation: the same loss on held-out clips
(`eval/loss`). Fine-tune the result with `configs/k400_ft.py`
(`--config.init_from=/runs/videomae_vitb_k400`: its latest checkpoint).

Data, once:

    # Kinetics clips -> chunks (one per 10 s clip), short side 320 px
    # (AVION's train_320px); video ids are the file stems
    # (youtube_id_000047_000057), as the kinetics format expects.
    python -m vidjax.data.chunk /data/k400/train /data/k400_chunks \
        --chunk-seconds 15 --short-side 320 --workers 16
    python -m vidjax.data.chunk /data/k400/val /data/k400_chunks \
        --chunk-seconds 15 --short-side 320 --workers 16

One 8-GPU machine (AVION used 64 per GPU x 4 GPUs; 32 x 8 keeps its global
batch of 256, so its learning rate and schedule apply unchanged):

    python -m vidjax.main --config configs/videomae_vitb_k400_pretrain.py \
        --workdir /runs/videomae_vitb_k400 \
        --config.data.root=/data/k400_chunks \
        --config.data.train_annotations=/data/k400/annotations/train.csv \
        --config.data.eval_annotations=/data/k400/annotations/val.csv

One GPU (an H200 with 16 cores): add `--config.data.repeats=4`, 4 views of
each decoded clip (MAE-ST's repeated sampling, its `repeat_aug` 4). The GPU
trains about 1,860 masked 16x4 clips a second, but a core decodes about 76
(`python -m benchmarks.pipeline`, BENCHMARKS.md): ~25 cores would be
needed, and 16 feed ~1,200. MAE-ST's reasoning holds here: with 90 % of the
tubes masked, each view of a clip (its own crop, flip and mask) is a mostly
new reconstruction task, while decoding is what a step costs the host; so
decode once, train on R views. Epochs count views (MAE-ST's effective
epochs): 800 epochs stay 800 at R=4, each clip decoded a quarter as often.
The batch keeps counting views (256), so the learning rate is unchanged.

Paths are the user's to give (they default to ''). Annotations are the
official Kinetics CSVs (train.csv, val.csv:
label,youtube_id,time_start,time_end,split), or AVION's video lists
k400_320p_train_list.txt / k400_val_list.txt (`path num_frames label`) with
`--config.data.format=kinetics_list`.
`total_steps` assumes 240,000 training clips (the count depends on how many
videos are still online): `--config.total_epochs=800` counts 800 epochs of
yours instead (the warmup stays 40 x 937 steps).

AVION's reported numbers (not ours): after fine-tuning (`k400_ft.py`),
Kinetics-400 top-1 / top-5 80.1 / 94.5 (README; docs/MODEL_ZOO.md: 80.0 /
94.5), against VideoMAE's 80.0 / 94.4; 800 epochs took 583 GPU-hours on
4x NVIDIA A5000 (VideoMAE's code: 995 on the same machine).

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch command: --optimizer lion,
--batch-size 64 on 4 GPUs) and scripts/main_videomae_pretrain.py (argparse
defaults, lr scaled by batch / 256); see `get_config`.
`configs/videomae_vitb_k400_pretrain.py:debug`: the same task and model,
tiny, 2 steps on the synthetic corpus (JSONL, CPU).
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
  # step holds at most 10 GiB (`python -m benchmarks.memory --config
  # configs/videomae_vitb_k400_pretrain.py`), the encoder seeing 10% of
  # the tokens.

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
    min_lr=1e-5 * c.batch_size / 256,
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
