"""Demo: a small video-text CLIP on synthetic videos, on CPU in a few minutes.

    python -m vidjax.main --config configs/demo.py --workdir /tmp/vidjax_demo

Writes a synthetic corpus into the workdir (96 short H.264 videos of moving
coloured shapes, two captioned segments each, e.g. "a red square moves left",
chunked with the chunker), then trains a tiny video ViT + text transformer
with the contrastive loss over the global batch, on all local devices, and
evaluates text->video and video->text retrieval on 48 held-out clips (24
unseen videos). Everything the real recipes use runs: chunked decoding with
the fused crop, Grain, on-device augmentation, sharded jitted steps,
checkpoints, metrics.jsonl.

Expected on a 2-core CPU machine: about 3 minutes; the final eval has
eval/t2v_r1 several times eval/chance_r1 (1/48 = 0.021).

`configs/demo.py:debug` runs 2 steps on a smaller corpus (tests).

The synthetic corpus is only used when no data path is set: with
`--config.data.root=...` and the annotation paths the demo trains on your own
videos (`configs/own_videos.py` is made for that; see the README).
"""
import ml_collections

from vidjax import models, optim
from vidjax.data import pipeline


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "contrastive"
  c.total_steps = 300
  c.batch_size = 32
  c.accum_steps = 1
  c.fsdp = 1
  c.resume = ""
  c.init_from = ""
  c.peak_tflops = 0.0  # Per device; 0 = look the device kind up.

  c.data = pipeline.default_data_config()
  c.data.update(num_frames=4, sampling="segment", size=64, crop="random_resized",
                crop_scale=(0.8, 1.0), hflip=0.0,  # A flip would swap left/right.
                workers=0, threads=2, device_prefetch=2)
  c.data.synthetic = ml_collections.ConfigDict(dict(
      enabled=True, num_videos=96, segments_per_video=2, segment_seconds=3.0,
      height=96, width=128, seed=0))

  c.model = models.default_model_config("clip")
  c.model.update(variant="Ti/16", width=64, depth=2, heads=2, image_size=64,
                 num_frames=4, embed_dim=64, drop_path=0.0, dtype="float32")
  c.model.text.update(vocab_size=1024, width=64, heads=2, layers=2)

  c.optim = optim.default_optim_config()
  c.optim.update(name="adamw", lr=2e-3, min_lr=1e-5, warmup_steps=20,
                 weight_decay=0.05, schedule="cosine", clip_grad_norm=1.0)

  c.augment = ml_collections.ConfigDict(dict(hflip=False))
  c.eval = ml_collections.ConfigDict(dict(every_steps=100, batch_size=48,
                                          relevancy=""))
  c.checkpoint = ml_collections.ConfigDict(dict(every_steps=100, keep=2))
  c.log = ml_collections.ConfigDict(dict(every_steps=10))

  if arg == "debug":
    c.total_steps = 2
    c.batch_size = 16
    c.data.synthetic.update(num_videos=8, segment_seconds=2.0)
    c.eval.update(every_steps=0, batch_size=8)
    c.checkpoint.every_steps = 2
    c.log.every_steps = 1
  elif arg:
    raise ValueError(f"configs/demo.py: unknown variant {arg!r} (try :debug)")
  return c
