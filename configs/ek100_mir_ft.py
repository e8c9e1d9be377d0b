r"""EPIC-Kitchens-100 multi-instance retrieval: fine-tune the video-text CLIP.

The ViT-B/16 dual encoder of `clip_vitb16_ego4d.py` on 16-frame clips, 100
epochs of the 67,217 training clips each paired with a caption of relevancy
> 0.1; evaluated on the 9,668 test clips x 3,842 captions (`eval/mAP_avg`,
`eval/nDCG_avg`), the best checkpoint by `eval/mAP_avg`. Default: AVION's
max-margin loss (0.2), batch 8 x 64. `:sms`: SMS-Loss's recipe, the SMS loss
on every in-batch pair's training relevancy (margin 0.6, threshold 0.1),
batch 4 x 64, lr 2e-5 from 1e-6 to 2e-6, from AVION's LaViLa ViT-B.
`:debug`: tiny, 2 steps on the synthetic corpus's released layouts (CPU).

    A=/data/epic-kitchens-100-annotations/retrieval_annotations
    python -m vidjax.main --config configs/ek100_mir_ft.py:sms \
        --workdir /runs/ek100_mir_sms \
        --config.init_from=/weights/avion_pretrain_lavila_vitb_best.pt \
        --config.data.root=/data/ek100_chunks \
        --config.data.train_annotations=$A/EPIC_100_retrieval_train.csv \
        --config.data.train_sentences=$A/EPIC_100_retrieval_train_sentence.csv \
        --config.data.train_relevancy=/data/ek100_relevancy_train.npy \
        --config.data.eval_annotations=$A/EPIC_100_retrieval_test.csv \
        --config.eval.sentences=$A/EPIC_100_retrieval_test_sentence.csv \
        --config.eval.relevancy=/data/ek100_relevancy_test.npy \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz

(AVION's recipe: no `:sms`, `init_from` a `clip_vitb16_ego4d.py` run.)
Published, not ours (mAP / nDCG, avg): AVION ViT-B 52.0 / 66.5 (its
MODEL_ZOO.md). With SMS, leaderboard entries on AVION's dual encoder: 63.76
/ 74.25 (arXiv 2406.12256: ensemble, flip at test), 66.78 / 82.08 (arXiv
2506.10550, CR-CLIP: "without using ensemble", its own cross-attention
module); a single ViT-B with SMS alone: not pinned (docs/scoreboard.md).
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("sms", "debug"))
  c = defaults.base_config("retrieval")
  # init_from: the contrastive checkpoint (AVION: --pretrain-model).
  # MaxMarginRankingLoss: loss.margin 0.2.

  c.data.update(
    format="ek100_mir",
    # Positives: captions of relevancy > 0.1 (AVION's `self.relevancy`,
    # data.positive_threshold) in data.train_sentences and train_relevancy.
    # --clip-length 16 segment frames (AVION's `get_frame_ids`),
    # RandomResizedCrop(224, scale=(0.5, 1.0)), no flip; at eval a centre
    # crop of the whole segment.
    num_frames=16,
    hflip=0.0,
    workers=16,
    threads=4,
  )

  c.model.update(
    embed_dim=256,  # The pretraining's --project-embed-dim.
    drop_path=0.0,  # --drop-path-rate 0
    learn_logit_scale=False,  # freeze_temperature=True
    # GPU memory at 64 clips per GPU, by remat policy (1.0-1.3x what XLA
    # compiles; `python -m benchmarks.memory --config
    # configs/ek100_mir_ft.py`, with the most clips per GPU that fit
    # 24 / 80 / 141 GB): none 102 GiB (44 / 79 clips on 80 / 141 GB),
    # save_dots_and_attention 47 (27 / 98 / 177), save_attention 20
    # (69 / 247 / 447), full 17 (AVION's --grad-checkpointing). The default
    # fits 80 GB GPUs; on 24-48 GB use "save_attention" (no second
    # attention pass, the costly part at 16 frames).
    remat="save_dots_and_attention",
  )

  # 100 epochs (1 of warmup) at 64 clips per GPU on 8 GPUs: 131 steps each.
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["ek100"],
    epochs=100,
    warmup_epochs=1,
    batch_size=8 * 64,
  )
  c.optim.update(
    lr=3e-5,
    warmup_lr=1e-6,  # --lr-start: the warmup starts there, not at 0
    min_lr=1e-5,  # cosine after the warmup
    b2=0.999,
    eps=1e-8,
    weight_decay=0.01,
    no_decay_names=("pos_embed", "spatial_pos"),
  )

  # eval.relevancy: caption_relevancy_EPIC_100_retrieval_test (.npy/.pkl);
  # eval.sentences: EPIC_100_retrieval_test_sentence.csv.
  c.eval.update(
    every_steps=5 * steps_per_epoch,  # --eval-freq 5 (epochs)
    batch_size=512,
  )
  c.checkpoint.update(
    every_steps=5 * steps_per_epoch, best_metric="eval/mAP_avg"
  )  # AVION: best avg mAP

  if "sms" in variants:
    _sms(c)
  if "debug" in variants:
    _debug(c)
  return c


def _sms(c: ml_collections.ConfigDict) -> None:
  """SMS-Loss's recipe (xqwang14/SMS-Loss `mir_finetune_vitb.sh`): the SMS
  loss on every in-batch pair's training relevancy, 4 GPUs x 64, AdamW at
  2e-5 after a warmup from 1e-6, cosine to 2e-6; 100 epochs, 1 of warmup,
  evaluated every 5 (its `ammplus_finetune.py` defaults)."""
  c.loss.update(name="sms", margin=0.6, threshold=0.1)
  steps_per_epoch = recipe.schedule(
    c,
    recipe.TRAIN_CLIPS["ek100"],
    epochs=100,
    warmup_epochs=1,
    batch_size=4 * 64,
  )
  c.optim.update(lr=2e-5, warmup_lr=1e-6, min_lr=2e-6)
  c.eval.every_steps = 5 * steps_per_epoch
  c.checkpoint.every_steps = 5 * steps_per_epoch


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU.

  The corpus has EK-100's retrieval layouts: `ek100_retrieval_{train,val}
  .csv` (captions repeat), their sentence CSVs and clips x captions relevancy
  pickles, which the run points `data.train_*` and `eval.*` at.
  The backbone is every :debug recipe's: `clip_vitb16_ego4d.py:debug`
  checkpoints initialise it.
  """
  recipe.debug_on_synthetic(c)
  recipe.tiny_model(c)
