r"""Video-text CLIP ViT-B/16 on Ego4D narrations: AVION's dual-encoder pretraining.

A 4-frame video ViT-B/16 and CLIP's text tower, both from OpenAI's CLIP,
trained with InfoNCE over the global batch of 2048 clip-narration pairs for
5 epochs of the ~4.0M Ego4D clips; the best checkpoint by zero-shot EK-100
MIR (`eval/ek100_mir/mAP_avg`), as AVION. Variants, joined by commas:
`:lavila` (LaViLa's LLM-augmented narrations), `:flip` (masked, not
AVION's), `:debug` (tiny, 2 steps on the synthetic corpus, CPU).

One 8-GPU machine (batch 256 per GPU, as AVION; the files and the data
prepared once: docs/recipes.md):

    A=/data/epic-kitchens-100-annotations/retrieval_annotations
    python -m vidjax.main --config configs/clip_vitb16_ego4d.py \
        --workdir /runs/clip_vitb16_ego4d \
        --config.init_from=/weights/ViT-B-16.pt \
        --config.data.root=/data/ego4d_chunks \
        --config.data.train_annotations=/data/ego4d_train.jsonl \
        --config.data.eval_annotations=/data/ego4d_val_4k.jsonl \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz \
        --config.eval.sets.ek100_mir.data.root=/data/ek100_chunks \
        --config.eval.sets.ek100_mir.data.eval_annotations=$A/EPIC_100_retrieval_test.csv \
        --config.eval.sets.ek100_mir.sentences=$A/EPIC_100_retrieval_test_sentence.csv \
        --config.eval.sets.ek100_mir.relevancy=/data/ek100_relevancy_test.npy

AVION's reported numbers (not ours), zero-shot EK-100 MIR: average mAP 27.4
(its README; its MODEL_ZOO.md: 27.5 / 28.4, average nDCG 29.1 / 29.5) after
~130 GPU-hours; `:lavila` 33.2 (its README; MODEL_ZOO: 31.1 / 32.9, nDCG
31.9 / 32.7) after ~260, on 8x NVIDIA A5000 (24 GB). Hyper-parameters:
AVION's MODEL_ZOO.md and scripts/main_lavila_pretrain.py; see `get_config`.
Less GPU memory, matching AVION's code exactly: docs/recipes.md; `:flip`:
docs/avion.md.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug", "lavila", "flip"))
  c = defaults.base_config("contrastive")
  # init_from: OpenAI CLIP ViT-B-16.pt (AVION: --pretrain-zoo openai).
  # Fresh 256-d projections (OpenAI's 512-d ones do not fit) and the fixed
  # 1/0.07 temperature (an image CLIP's is not carried over), as AVION.

  c.data.update(
    format="ego4d",
    # --clip-length 4: one frame from each of 4 equal segments, jittered.
    num_frames=4,
    # Fused decode + RandomResizedCrop(224, scale=(0.5, 1.0)), no flip.
    hflip=0.0,
    # AVION: 8 loader processes per GPU; 16 x 4 threads decode as many.
    workers=16,
    threads=4,
  )

  # ViT-B/16 towers; act and ln_eps from the weights (OpenAI's: QuickGELU,
  # 1e-5); CLIP mean/std.
  c.model.update(
    embed_dim=256,  # --project-embed-dim 256 (fresh projections).
    drop_path=0.0,  # --drop-path-rate 0
    learn_logit_scale=False,  # --freeze-temperature: stays at 1/0.07.
    # GPU memory at 256 clips per GPU, by remat policy (1.0-1.3x what XLA
    # compiles; `python -m benchmarks.memory --config
    # configs/clip_vitb16_ego4d.py`, which also prints the most clips per
    # GPU that fit 24 / 80 / 141 GB): none 107 GiB (304 on a 141 GB GPU),
    # save_dots_and_attention 49 (105 / 375 / 678 clips), save_attention 21
    # (265 / 947 / 1713), full 17 (AVION's --grad-checkpointing). The
    # default, which recomputes only elementwise work, fits 80 GB GPUs; on
    # 24-48 GB use "save_attention". A run refuses at start-up what will
    # not fit.
    remat="save_dots_and_attention",
  )

  # 5 epochs of LaViLa's ego4d_train.pkl at 256 clips per GPU on 8 GPUs:
  # 9765 steps of 2048. If your narration file differs, set total_steps, or
  # count its epochs: --config.total_epochs=5 --config.eval.every_epochs=1.
  steps_per_epoch = recipe.schedule(
    c, recipe.TRAIN_CLIPS["ego4d"], epochs=5, batch_size=8 * 256
  )
  c.optim.update(
    lr=3e-5,
    schedule="constant",  # --fix-lr, no warmup
    b2=0.999,
    eps=1e-8,
    weight_decay=0.01,
    # AVION decays every >= 2-d weight except positional tables.
    no_decay_names=("pos_embed", "spatial_pos"),
  )

  c.eval.update(every_steps=steps_per_epoch, batch_size=1024)
  # Zero-shot EK-100 MIR (`eval/ek100_mir/...`), as AVION's --val-metadata
  # EPIC_100_retrieval_test.csv with its sentences and test relevancy:
  # 4-frame centre-cropped clips of the EK-100 chunks.
  c.eval.sets.ek100_mir = defaults.eval_set("ek100_mir", allow_pickle=False)
  # AVION keeps checkpoint_best by zero-shot EK-100 MIR average mAP.
  c.checkpoint.best_metric = "eval/ek100_mir/mAP_avg"
  # LaViLa's zero-shot list, optional (skipped until their files are given):
  # EgoMCQ every epoch, as LaViLa; EGTEA, Charades-Ego and EK-100 CLS
  # zero-shot with the run's frames (docs/scoreboard.md for the papers'
  # protocols with --mode eval).
  for name in ("egomcq", "egtea", "charades_ego", "ek100_cls"):
    c.eval.sets[name] = defaults.benchmark_set(name)

  clips = recipe.TRAIN_CLIPS["ego4d"] * (2 if "lavila" in variants else 1)
  if "lavila" in variants:
    # AVION's LLM-augmented pretraining on LaViLa's two narration files: the
    # rephraser and narrator files each hold the ~4.0M clips (with lists of
    # narrations), so an epoch is twice as long (~260 vs ~130 GPU-hours).
    steps_per_epoch = recipe.schedule(
      c, clips, epochs=5, batch_size=c.batch_size
    )
    c.eval.every_steps = steps_per_epoch  # Still every epoch: 3906 steps.
  if "flip" in variants:
    # FLIP's masking at 50%: half the vision tower's tokens in training,
    # and the memory that saves spent on a batch twice as large (FLIP's
    # Table 1a), its learning rate scaled with it (FLIP's linear rule).
    c.model.update(mask_ratio=0.5, mask_kind="random")
    steps_per_epoch = recipe.schedule(c, clips, epochs=5, batch_size=2 * 2048)
    c.eval.every_steps = steps_per_epoch
    c.optim.lr *= 2
    # The unmasked tuning: the last 1% of the steps (49 of 4880), at 1/100
    # of the rate after a warmup (FLIP's released recipe), in 2
    # microbatches (every token kept: ~1.9x the memory per clip).
    c.unmask_fraction = 0.01
    c.unmask_lr = c.optim.lr / 100
    c.unmask_accum_steps = 2
  if "debug" in variants:
    _debug(c)
  if "flip" in variants:
    # A tenth of the tuning's steps (our choice: FLIP's released recipe
    # warms up, its length here is not FLIP's).
    c.unmask_warmup_steps = round(c.unmask_fraction * c.total_steps / 10)
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU; both sets
  evaluated (the corpus has EK-100's retrieval files) and their embeddings
  saved.

  The tiny backbone is every :debug recipe's, so this run's checkpoints
  initialise the :debug fine-tunes (`ek100_mir_ft.py`, `ek100_cls_ft.py`).
  """
  recipe.debug_on_synthetic(c, format="jsonl")
  c.eval.save_embeddings = True
  recipe.tiny_model(c)
