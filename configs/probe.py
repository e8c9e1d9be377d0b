r"""A probe on a frozen encoder: adapt released or trained weights to labels.

The video tower of `init_from` (AVION, LaViLa, CLIP or a vidjax run;
VideoMAE with `--config.model.backbone=videomae`) stays as it is; its
features of every training clip (evaluation views, no augmentation) are
computed once into WORKDIR/features/ and a probe trains on them: a linear
layer on the pooled features (default) or, `:attentive`, a learned query
cross-attending over the patch tokens (V-JEPA 2's attentive probe). Any
labelled set vidjax reads (`data.format`: kinetics, ek100_cls, egtea,
jsonl with labels, your own videos' rows); evaluated on the videos as every
classification recipe (`eval/top1`, `eval/mean_class_acc`, the chance
level), resumable. `:demo`: the demo's tiny encoder on the synthetic
corpus's colour-and-shape labels (12 classes); `:debug`: 2 steps.

    python -m vidjax.main --config configs/probe.py --workdir /runs/probe \
        --config.init_from=/weights/avion_finetune_cls_lavila_vitb_best.pt \
        --config.data.format=egtea --config.model.num_classes=106 \
        --config.data.root=/data/egtea_chunks \
        --config.data.train_annotations=/data/EGTEA/train_split1.txt \
        --config.data.eval_annotations=/data/EGTEA/test_split1.txt

    python -m vidjax.main --config configs/demo.py --workdir /tmp/demo
    python -m vidjax.main --config configs/probe.py:demo --workdir /tmp/probe \
        --config.init_from=/tmp/demo

Measured here (CPU; docs/own_videos.md): the demo's encoder after 16 steps,
24 held-out clips' colour and shape, top-1 0.50 (linear) / 0.58
(attentive) against chance 1/12, at 9 ms a probe step against 280 ms a
fine-tune step. Per benchmark, the numbers to beat: docs/scoreboard.md.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("attentive", "demo", "debug"))
  c = defaults.base_config("classification")
  c.data.update(num_frames=16, hflip=0.0, workers=8, threads=4)
  c.model.update(
    backbone="clip",  # AVION / LaViLa / CLIP towers; VideoMAE: 'videomae'.
    tubelet=1,
    probe="attentive" if "attentive" in variants else "linear",
    drop_path=0.0,
  )
  c.init_keep = ("probe.",)  # The attentive probe: new, as the head.
  c.optim.update(
    frozen=("encoder",),  # Only the probe trains.
    lr=1e-3,
    min_lr=1e-5,
    weight_decay=0.01,
    b2=0.999,
    eps=1e-8,
  )
  c.model.num_classes = 0  # 0: the largest training label + 1.
  c.batch_size = 256
  c.total_steps = 2000
  c.optim.warmup_steps = 100
  c.eval.update(every_steps=500, batch_size=64)
  c.checkpoint.update(every_steps=500, best_metric="eval/top1")
  if "demo" in variants or "debug" in variants:
    _demo(c)
  if "debug" in variants:
    recipe.debug_on_synthetic(c, format="ek100_cls", label="noun", hflip=0.0)
  return c


def _demo(c: ml_collections.ConfigDict) -> None:
  """The demo's corpus and tiny encoder: colour-and-shape labels (the
  EK-100 layout's noun: 3 shapes x 4 colours) of its clips."""
  c.data.update(format="ek100_cls", label="noun", num_frames=4, size=64)
  c.data.update(workers=0, threads=2)
  c.data.synthetic.enabled = True
  recipe.tiny_model(c, num_classes=12, tubelet=1)
  c.batch_size, c.total_steps = 32, 300
  c.optim.update(lr=1e-2, warmup_steps=10)
  c.eval.update(every_steps=100, batch_size=48)
  c.checkpoint.every_steps = 100
