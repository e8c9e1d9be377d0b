r"""EPIC-Kitchens-100 multi-instance retrieval: fine-tune the video-text CLIP.

What it trains: the ViT-B/16 dual encoder from `clip_vitb16_ego4d.py`, now
on 16-frame clips, with the max-margin ranking loss (margin 0.2) over the
global batch of 512 clip-narration pairs, for 100 epochs of the 67,217 EK-100
retrieval training clips, AdamW with cosine decay. The temperature stays
frozen (the ranking loss does not use it). Evaluation: mAP and nDCG over the
9,668 test clips against the relevancy matrix (`eval/mAP_avg`,
`eval/nDCG_avg`, ...), plus recall@K (`eval/t2v_r1`).

Data, once:

    # EK-100 videos -> 15 s chunks, short side 320, 30 fps (AVION's
    # EK100_320p_15sec_30fps_libx264); video ids are the file stems (P01_01).
    python -m vidjax.data.chunk /data/EPIC-KITCHENS /data/ek100_chunks \
        --chunk-seconds 15 --short-side 320 --fps 30 --workers 16
    # The released relevancy pickle -> .npy (unpickling runs code).
    A=/data/epic-kitchens-100-annotations/retrieval_annotations
    python -m vidjax.data.annotations convert-relevancy \
        $A/relevancy/caption_relevancy_EPIC_100_retrieval_test.pkl \
        /data/ek100_relevancy_test.npy --allow-pickle

One 8-GPU machine (batch 64 per GPU, as AVION):

    python -m vidjax.main --config configs/ek100_mir_ft.py \
        --workdir /runs/ek100_mir_ft \
        --config.init_from=/runs/clip_vitb16_ego4d/checkpoints/9765 \
        --config.data.root=/data/ek100_chunks \
        --config.data.train_annotations=$A/EPIC_100_retrieval_train.csv \
        --config.data.eval_annotations=$A/EPIC_100_retrieval_test.csv \
        --config.eval.relevancy=/data/ek100_relevancy_test.npy \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz

All paths are the user's to give (they default to ''). `init_from` is the
contrastive model to start from (AVION: --pretrain-model); its 4-frame
temporal embedding is interpolated to 16 frames. `eval.relevancy` is the
released test relevancy (caption_relevancy_EPIC_100_retrieval_test.pkl,
converted above). Zero-shot evaluation of a pretrained model: the same
command with `--mode eval` (and `data.num_frames` / `model.num_frames` 4, as
AVION evaluates its pretraining).

AVION's reported numbers (not ours), fine-tuned from its LLM-augmented
(LaViLa) ViT-B pretraining: V->T / T->V / avg mAP 55.7 / 48.2 / 52.0 and
nDCG 67.8 / 65.3 / 66.5 (docs/MODEL_ZOO.md); README: 51.7 mAP, 66.8 nDCG.
8x NVIDIA A5000 (24 GB). Starting from the baseline (not LLM-augmented)
pretraining of `clip_vitb16_ego4d.py`, expect less.

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch command) and
scripts/main_lavila_finetune_mir.py (argparse defaults); see `get_config`.
`configs/ek100_mir_ft.py:debug`: the same task, model and annotation format,
tiny, 2 steps on the synthetic corpus with its relevancy matrix (CPU).
"""
import ml_collections

from vidjax import config as config_lib, models, optim
from vidjax.data import pipeline

EK100_MIR_TRAIN_CLIPS = 67_217  # EPIC_100_retrieval_train.csv rows.
GPUS, BATCH_PER_GPU, EPOCHS, WARMUP_EPOCHS = 8, 64, 100, 1
BATCH = GPUS * BATCH_PER_GPU  # 512
STEPS_PER_EPOCH = EK100_MIR_TRAIN_CLIPS // BATCH  # 131 (drop_last)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "retrieval"
  c.total_steps = EPOCHS * STEPS_PER_EPOCH  # 13100
  c.batch_size = BATCH
  c.accum_steps = 1
  c.fsdp = 1
  c.resume = ""
  c.init_from = ""  # The contrastive checkpoint (AVION: --pretrain-model).
  c.peak_tflops = 0.0
  c.loss = ml_collections.ConfigDict(dict(margin=0.2))  # MaxMarginRankingLoss

  c.data = pipeline.default_data_config()
  c.data.update(
      format="ek100_mir",
      # --clip-length 16 segment frames (AVION's `get_frame_ids`).
      num_frames=16, sampling="segment", size=224,
      crop="random_resized", crop_scale=(0.5, 1.0), hflip=0.0,
      eval_clips=1, eval_crops=1,  # Centre crop of the whole segment.
      workers=16, threads=4, device_prefetch=2)

  c.model = models.default_model_config("clip")
  c.model.update(
      variant="B/16", image_size=224, num_frames=16, tubelet=1,
      embed_dim=256,  # The pretraining's --project-embed-dim.
      act="quick_gelu", drop_path=0.0,  # --drop-path-rate 0
      learn_logit_scale=False,  # freeze_temperature=True
      # GPU memory at 64 clips per GPU, by remat policy (upper bounds,
      # `python -m vidjax.bench.memory --config configs/ek100_mir_ft.py`):
      # none 127 GiB, save_dots_and_attention 43, save_attention 15, full 11
      # (AVION's --grad-checkpointing, for its 24 GB cards). The default fits
      # 80 GB GPUs; on 24-48 GB use "save_attention" (no second attention
      # pass, the costly part at 16 frames).
      remat="save_dots_and_attention",
      dtype="auto", attention="auto")

  c.optim = optim.default_optim_config()
  c.optim.update(
      name="adamw", lr=3e-5, min_lr=1e-5, schedule="cosine",
      warmup_steps=WARMUP_EPOCHS * STEPS_PER_EPOCH,
      b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, clip_grad_norm=0.0,
      no_decay_names=("pos_embed", "spatial_pos"))

  c.augment = ml_collections.ConfigDict(dict(hflip=False))  # CLIP mean/std.
  c.eval = ml_collections.ConfigDict(dict(
      every_steps=5 * STEPS_PER_EPOCH,  # --eval-freq 5 (epochs)
      batch_size=512,
      relevancy=""))  # caption_relevancy_EPIC_100_retrieval_test as .npy
  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=5 * STEPS_PER_EPOCH, keep=2))
  c.log = ml_collections.ConfigDict(dict(every_steps=10))

  if arg == "debug":
    _debug(c)
  elif arg:
    raise ValueError(f"configs/ek100_mir_ft.py: unknown variant {arg!r} "
                     "(try :debug)")
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU.

  The corpus's `ek100_{train,val}.csv` are in the EK-100 layout, and its
  `relevancy_val.npy` (clips x clips of the validation split) becomes
  `eval.relevancy` (`synthetic.relevancy`).
  """
  config_lib.debug_on_synthetic(c)
  c.data.synthetic.relevancy = True
  c.model.update(variant="Ti/16", width=64, depth=2, heads=2, image_size=64,
                 num_frames=4, embed_dim=64, remat="none", dtype="float32")
  c.model.text.update(vocab_size=1024, width=64, heads=2, layers=2)
