r"""UMT ViT-B/16 pretraining on Kinetics-400: align to a frozen CLIP.

Unmasked Teacher (UMT, arXiv 2303.16058): a ViT-B/16 student on 8 frames
(one from each of 8 segments, tubelets of 1) keeps 20% of each frame's
patches, drawn by the class-token attention of a frozen CLIP ViT-B/16
(OpenAI's), and aligns the outputs of its last 6 blocks, through one
linear + LayerNorm head each, to the teacher's last 6 of the same tokens
(UMT's `l2` loss, 2 - 2 cos of normalised features). 201 epochs (40 of
warmup) of the ~240k Kinetics-400 training clips, AdamW, global batch
2048. Evaluated by the same loss on held-out clips (`eval/loss`);
fine-tune the student with `configs/k400_ft.py` (UMT's fine-tuning: 8
sparse frames, tubelets of 1; docs/recipes.md). `:debug`: tiny, 2 steps on
the synthetic corpus (JSONL, CPU); its teacher is the demo's CLIP.

One 8-GPU machine (the chunks and annotations: docs/recipes.md):

    python -m vidjax.main --config configs/umt_vitb_k400_pretrain.py \
        --workdir /runs/umt_vitb_k400 \
        --config.model.teacher.source=/weights/ViT-B-16.pt \
        --config.data.root=/data/k400_chunks \
        --config.data.train_annotations=/data/k400/annotations/train.csv \
        --config.data.eval_annotations=/data/k400/annotations/val.csv

`total_steps` assumes 240,000 training clips: `--config.total_epochs=201`
counts 201 epochs of yours instead.

UMT's reported numbers (not ours; its repository's MODEL_ZOO.md): the
ViT-B/16 pretrained so for 200 epochs on Kinetics-710 then fine-tuned on
K710 and K400 reaches 87.4 top-1 on Kinetics-400 (8 frames x 3 crops x 4
clips); its README: the ViT-L/16's two stages took 6 days on 32 A100s.
AVION's VideoMAE ViT-B/16 (`videomae_vitb_k400_pretrain.py`, 800 epochs of
16-frame pixel reconstruction): 80.1 top-1 after fine-tuning, 583 GPU-hours
on 4x A5000. Hyper-parameters: UMT's
single_modality/exp/pretraining/b16_ptk710_f8_res224.sh and
run_umt_pretraining.py (lr scaled by batch / 256); see `get_config`.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("distill")
  # From scratch; the teacher is the user's (model.teacher.source).

  c.data.update(
    format="kinetics",
    sampling="segment",  # --num_segments 8 --num_frames 8: sparse
    num_frames=8,
    # GroupMultiScaleCrop(224, [1, .875, .75, .66]) + flip 0.5.
    crop="multi_scale",
    workers=16,
    threads=4,
  )

  # ViT-B/16 on tubelets of 1 (--tubelet_size 1), --drop_path 0.1,
  # --mask_type attention --mask_ratio 0.8, --clip_return_layer 6
  # (interval 1), --clip_loss_type l2; the heads map 768 to the teacher's
  # 512 (--clip_decoder_embed_dim 768 --clip_output_dim 512).
  # 53 GiB per GPU at 256 clips, no remat (`python -m benchmarks.memory
  # --config configs/umt_vitb_k400_pretrain.py`: 99 / 347 / 625 clips fit
  # 24 / 80 / 141 GB; "save_dots_and_attention" 178 / 623 / 1122).
  c.model.update(tubelet=1, drop_path=0.1, mask_ratio=0.8, select="attention")
  c.model.align_layers = 6
  # --clip_teacher clip_b16: OpenAI's CLIP ViT-B/16, in bfloat16 on GPUs;
  # its sizes are read from the weights at start-up.
  c.model.teacher.update(variant="B/16", embed_dim=512, dtype="auto")
  c.loss.align = "l2"

  # 201 epochs (40 of warmup) at 256 clips per GPU on 8 GPUs (UMT's 64 x
  # 32): 117 steps each.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["k400"],
    epochs=201,
    warmup_epochs=40,
    batch_size=2048,
  )
  c.optim.update(
    name="adamw",
    b1=0.9,
    b2=0.95,  # --opt_betas 0.9 0.95
    eps=1e-8,
    weight_decay=0.05,
    # UMT scales lr and min_lr by batch / 256; cosine after the warmup.
    lr=1.5e-4 * c.batch_size / 256,
    min_lr=1e-5 * c.batch_size / 256,
  )
  # The student and the teacher see the same frames, normalised with the
  # ImageNet statistics as UMT's (and VideoMAE's, and k400_ft.py's).
  c.augment.update(mean=defaults.IMAGENET_MEAN, std=defaults.IMAGENET_STD)
  c.eval.update(every_steps=20 * steps_per_epoch, batch_size=256)
  c.checkpoint.every_steps = 5 * steps_per_epoch
  c.log.every_steps = 50

  if "debug" in variants:
    _debug(c)
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny student on the synthetic corpus, on CPU.

  Its teacher is a trained demo CLIP (`configs/demo.py`, any size: it
  runs at the student's grid): `--config.model.teacher.source=WORKDIR`.
  The backbone is every :debug recipe's, so these checkpoints initialise
  `k400_ft.py:debug`.
  """
  recipe.debug_on_synthetic(c, format="jsonl", stride=4)
  recipe.tiny_model(c)
  c.model.align_layers = 2
  c.model.teacher.dtype = "float32"
  # No warmup: 2 steps that train, so the checkpoint is not the init.
  c.optim.warmup_steps = 0
