r"""Your own videos: a video-text CLIP from captions, or a classifier from labels.

The README's "Train on your own videos" walks through it. In short:

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
             retrieval recall; the CLIP vocabulary is found in open_clip when
             `data.vocab` is unset, and `model.text.vocab_size` 0 takes its size
  labels     classification, evaluated by top-1/top-5 accuracy;
             `model.num_classes` 0 takes the largest label + 1
  cpu        a tiny model (64 px, 4 frames) that trains on a CPU in minutes:
             to check your data and the whole path before renting GPUs

Without `cpu`: ViT-B/16 at 224 px, 8 frames, for one GPU machine. Starting
from released weights helps a lot on a small data set:
`--config.init_from=ViT-B-16.pt` (OpenAI's CLIP; for `labels` too, the
classifier then has a CLIP backbone). Before the first step the annotations
are checked against the chunk store; rows naming unknown videos, spans
outside their video, missing captions or labels are listed in
WORKDIR/bad_rows_*.jsonl and left out of training, and more than
`data.max_bad_row_fraction` of them stops the run. Set `total_steps` for your
data: the start-up summary prints the steps per epoch.
"""
import ml_collections

from vidjax import models, optim
from vidjax.data import pipeline

VARIANTS = ("captions", "labels", "cpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = set(arg.split(",")) if arg else set()
  unknown = variants - set(VARIANTS)
  if unknown or {"captions", "labels"} <= variants:
    raise ValueError(f"configs/own_videos.py: unknown variant {arg!r}; use "
                     "captions or labels, optionally with cpu (e.g. :labels,cpu)")
  labels = "labels" in variants

  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "classification" if labels else "contrastive"
  c.total_steps = 2000
  c.batch_size = 64
  c.accum_steps = 1
  c.fsdp = 1
  c.resume = ""
  c.init_from = ""  # e.g. OpenAI's ViT-B-16.pt
  c.peak_tflops = 0.0

  c.data = pipeline.default_data_config()  # Paths: yours to give.
  c.data.update(format="jsonl", num_frames=8, sampling="segment", size=224,
                crop="random_resized", crop_scale=(0.5, 1.0),
                hflip=0.5 if labels else 0.0,  # A caption may say left/right.
                workers=8, threads=4, device_prefetch=2)

  c.model = models.default_model_config("classifier" if labels else "clip")
  c.model.update(variant="B/16", image_size=224, num_frames=8, tubelet=1,
                 drop_path=0.1, dtype="auto", attention="auto", remat="full")
  if labels:
    c.model.update(backbone="clip", num_classes=0)  # 0: from the labels.
  else:
    c.model.text.vocab_size = 0  # 0: the vocabulary file's size.

  c.optim = optim.default_optim_config()
  c.optim.update(name="adamw", lr=1e-4 if labels else 3e-5, min_lr=1e-6,
                 schedule="cosine", warmup_steps=100, weight_decay=0.05,
                 clip_grad_norm=1.0)

  c.augment = ml_collections.ConfigDict(dict(hflip=False))  # CLIP mean/std.
  c.eval = ml_collections.ConfigDict(dict(every_steps=500, batch_size=64))
  if not labels:
    c.eval.relevancy = ""
  c.checkpoint = ml_collections.ConfigDict(dict(every_steps=500, keep=2))
  c.log = ml_collections.ConfigDict(dict(every_steps=10))

  if "cpu" in variants:
    c.total_steps = 200
    c.batch_size = 16
    c.data.update(num_frames=4, size=64, workers=0, threads=2)
    c.model.update(variant="Ti/16", width=64, depth=2, heads=2, image_size=64,
                   num_frames=4, drop_path=0.0, dtype="float32", remat="none")
    if not labels:
      c.model.update(embed_dim=64)
      c.model.text.update(width=64, heads=2, layers=2)
    c.optim.update(lr=1e-3, warmup_steps=20)
    c.eval.update(every_steps=100, batch_size=16)
    c.checkpoint.every_steps = 100
  return c
