r"""EPIC-Kitchens-100 multi-instance retrieval: fine-tune the video-text CLIP.

What it trains: the ViT-B/16 dual encoder from `clip_vitb16_ego4d.py`, now
on 16-frame clips, with the max-margin ranking loss (margin 0.2) over the
global batch of 512 clip-caption pairs, for 100 epochs of the 67,217 EK-100
retrieval training clips, AdamW with cosine decay. Each clip is paired with a
caption drawn among those of relevancy > 0.1 to it (AVION), from the train
sentence file and relevancy matrix. The temperature stays frozen (the ranking
loss does not use it). Evaluation: mAP and nDCG of the 9,668 test clips
against the 3,842 test captions (`eval/mAP_avg`, `eval/nDCG_avg`,
`eval/mAP_v2t`, ...), plus clip-to-own-narration recall@K (`eval/t2v_r1`).

Files, in the names the datasets ship them:
  EK-100 videos (P01_01.MP4, ...; or AVION's EK100_320p_15sec_30fps_libx264)
  epic-kitchens-100-annotations/retrieval_annotations/
    EPIC_100_retrieval_train.csv, EPIC_100_retrieval_test.csv
    EPIC_100_retrieval_train_sentence.csv, EPIC_100_retrieval_test_sentence.csv
  caption_relevancy_EPIC_100_retrieval_train.pkl (67217 x 15989) and
  caption_relevancy_EPIC_100_retrieval_test.pkl (9668 x 3842), from
  LaViLa/AVION (dl.fbaipublicfiles.com/lavila/metadata/EK100/)
  bpe_simple_vocab_16e6.txt.gz (CLIP's BPE vocabulary)

Data, once:

    # EK-100 videos -> 15 s chunks, short side 320, 30 fps (AVION's
    # EK100_320p_15sec_30fps_libx264); video ids are the file stems (P01_01).
    python -m vidjax.data.chunk /data/EPIC-KITCHENS /data/ek100_chunks \
        --chunk-seconds 15 --short-side 320 --fps 30 --workers 16
    # The relevancy pickles -> .npy (unpickling runs code; the training
    # matrix, several GB, is then memory-mapped instead of read whole).
    A=/data/epic-kitchens-100-annotations/retrieval_annotations
    for split in train test; do
      python -m vidjax.data.annotations convert-relevancy \
          /data/caption_relevancy_EPIC_100_retrieval_$split.pkl \
          /data/ek100_relevancy_$split.npy --allow-pickle
    done

One 8-GPU machine (batch 64 per GPU, as AVION):

    python -m vidjax.main --config configs/ek100_mir_ft.py \
        --workdir /runs/ek100_mir_ft \
        --config.init_from=/runs/clip_vitb16_ego4d \
        --config.data.root=/data/ek100_chunks \
        --config.data.train_annotations=$A/EPIC_100_retrieval_train.csv \
        --config.data.train_sentences=$A/EPIC_100_retrieval_train_sentence.csv \
        --config.data.train_relevancy=/data/ek100_relevancy_train.npy \
        --config.data.eval_annotations=$A/EPIC_100_retrieval_test.csv \
        --config.eval.sentences=$A/EPIC_100_retrieval_test_sentence.csv \
        --config.eval.relevancy=/data/ek100_relevancy_test.npy \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz

All paths are the user's to give (they default to ''). `init_from` is the
contrastive model to start from (AVION: --pretrain-model): a vidjax workdir
(its best checkpoint, else the latest), one checkpoint step directory, or
AVION's released `checkpoint_best.pt`; its 4-frame temporal embedding is
interpolated to 16 frames as AVION does. What was loaded, resized, dropped
or started fresh is logged and written to WORKDIR/init_from.json. Without
`data.train_relevancy` each clip trains against its own narration. The
relevancy pickles also load as they are with `data.allow_pickle=True`.
Under `accum_steps` > 1 (less GPU memory, or one GPU for the 512 clips) the
loss stays the max-margin ranking over all 512 pairs, its gradients those of
the unsplit batch, for one more forward pass (GradCache, `vidjax.steps`):
in AVION's issue #14 MIR fine-tuning lost 4 mAP at a smaller total batch.
`--config.eval.save_embeddings=True` writes the normalised clip and caption
embeddings of each evaluation to `WORKDIR/embeddings/step_<N>.npz` (with
their narration ids).

Zero-shot evaluation of a pretraining (AVION's 27.4 mAP row), no training:
the same command with `--mode eval --config.data.num_frames=4` (AVION
evaluates its pretraining on 4 frames) and `--workdir` a new directory.
The same at 16 frames with `init_from` one of AVION's downloaded MIR
checkpoints (the `.pt` of its model zoo) evaluates AVION's released
fine-tuned model. The run keeps its best checkpoint by `eval/mAP_avg`, as
AVION does. The activation, LayerNorm eps and temperature are the
pretraining's (read from it: a vidjax pretraining's from its config, an
AVION checkpoint's exact GELU and vision eps 1e-6); to run AVION's code's
function on a vidjax pretraining of OpenAI's weights, see
`clip_vitb16_ego4d.py`.

AVION's reported numbers (not ours), fine-tuned from its LLM-augmented
(LaViLa) ViT-B pretraining (`clip_vitb16_ego4d.py:lavila`): V->T / T->V /
avg mAP 55.7 / 48.2 / 52.0 and nDCG 67.8 / 65.3 / 66.5 (docs/MODEL_ZOO.md);
README: 51.7 mAP, 66.8 nDCG. 8x NVIDIA A5000 (24 GB). Starting from the
baseline (not LLM-augmented) pretraining of `clip_vitb16_ego4d.py`, expect
less.

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch command) and
scripts/main_lavila_finetune_mir.py (argparse defaults); see `get_config`.
`configs/ek100_mir_ft.py:debug`: the same task, model and files in the
released layouts (retrieval CSVs, sentence CSVs with fewer captions than
clips, clips x captions relevancy pickles), tiny, 2 steps on the synthetic
corpus (CPU).
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
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
    # GPU memory at 64 clips per GPU, by remat policy (upper bounds,
    # `python -m benchmarks.memory --config configs/ek100_mir_ft.py`):
    # none 127 GiB, save_dots_and_attention 43, save_attention 15, full 11
    # (AVION's --grad-checkpointing, for its 24 GB cards). The default fits
    # 80 GB GPUs; on 24-48 GB use "save_attention" (no second attention
    # pass, the costly part at 16 frames).
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

  if "debug" in variants:
    _debug(c)
  return c


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
