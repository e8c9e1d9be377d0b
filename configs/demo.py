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
eval/t2v_r1 several times eval/chance_r1 (1/48 = 0.021): 0.23-0.25, measured
here (BENCHMARKS.md).

`configs/demo.py:debug` runs 2 steps on a smaller corpus (tests).

The synthetic corpus is only used when no data path is set: with
`--config.data.root=...` and the annotation paths the demo trains on your own
videos (`configs/own_videos.py` is made for that; see docs/own_videos.md).
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("contrastive")
  c.total_steps = 300
  c.batch_size = 32

  c.data.update(
    num_frames=4,
    size=64,
    crop_scale=(0.8, 1.0),
    hflip=0.0,  # A flip would swap left/right.
    threads=2,
  )
  c.data.synthetic.enabled = True

  recipe.tiny_model(c, drop_path=0.0)

  c.optim.update(lr=2e-3, min_lr=1e-5, warmup_steps=20, clip_grad_norm=1.0)

  c.eval.update(every_steps=100, batch_size=48)
  c.checkpoint.every_steps = 100

  if "debug" in variants:
    recipe.debug_on_synthetic(c)
  return c
