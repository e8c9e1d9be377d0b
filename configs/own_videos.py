r"""Your own videos: a video-text CLIP from captions, or a classifier from labels.

docs/own_videos.md walks through it. In short:

    python -m vidjax.data.chunk ~/my_videos /data/mine/chunks --short-side 256
    # /data/mine/train.jsonl and val.jsonl, one clip per line:
    #   {"video_id": "bikes", "start": 0.0, "end": 4.5, "text": "two cyclists pass"}
    #   (seconds; "label": 3 instead of "text" for classes)
    python -m vidjax.main --config configs/own_videos.py:captions \
        --workdir runs/mine \
        --config.data.root=/data/mine/chunks \
        --config.data.train_annotations=/data/mine/train.jsonl \
        --config.data.eval_annotations=/data/mine/val.jsonl

Variants, joined by commas (`configs/own_videos.py:labels,cpu`):
  captions   (default) contrastive video-text CLIP, evaluated by text<->video
             retrieval recall; CLIP's vocabulary (vidjax ships it) when
             `data.vocab` is unset, and `model.text.vocab_size` 0 takes its size
  labels     classification, evaluated by top-1 accuracy (top-5 past 5
             classes) against its chance level;
             `model.num_classes` 0 takes the largest training label + 1
  cpu        a tiny model (64 px, 4 frames) that trains on a CPU in minutes:
             to check your data and the whole path before renting GPUs

Without `cpu`: ViT-B/16 at 224 px, 8 frames, for one GPU machine; start from
released weights (`--config.init_from=ViT-B-16.pt`, OpenAI's CLIP). Set
`total_steps` for your data (the start-up summary prints the steps per
epoch), or `total_epochs`.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(
    arg, ("captions", "labels", "cpu"), exclusive=("captions", "labels")
  )
  labels = "labels" in variants

  c = defaults.base_config("classification" if labels else "contrastive")
  c.total_steps = 2000
  # init_from: e.g. OpenAI's ViT-B-16.pt. Paths: yours to give.

  c.data.update(
    num_frames=8,
    hflip=0.5 if labels else 0.0,  # A caption may say left/right.
    workers=8,
    threads=4,
  )

  # ViT-B/16 at 224 px; CLIP mean/std. "full" remat: 3.2 GiB per GPU at 8
  # clips, 167 / 597 / 1080 clips fit 24 / 80 / 141 GB
  # (`python -m benchmarks.memory --config configs/own_videos.py`).
  c.model.update(tubelet=1, remat="full")
  if labels:
    c.model.update(backbone="clip", num_classes=0)  # 0: from the labels.

  c.optim.update(
    lr=1e-4 if labels else 3e-5, warmup_steps=100, clip_grad_norm=1.0
  )

  c.eval.every_steps = 500
  c.checkpoint.every_steps = 500

  if "cpu" in variants:
    c.total_steps = 200
    c.batch_size = 16
    c.data.update(num_frames=4, size=64, workers=0, threads=2)
    recipe.tiny_model(c, drop_path=0.0)
    c.optim.update(lr=1e-3, warmup_steps=20)
    c.eval.update(every_steps=100, batch_size=16)
    c.checkpoint.every_steps = 100
  if not labels:
    c.model.text.vocab_size = 0  # 0: the vocabulary file's size.
  return c
