r"""Charades-Ego: fine-tune the dual encoder on action clips, score it as a
classifier (LaViLa's protocol).

The whole video-text CLIP of `clip_vitb16_ego4d.py`, InfoNCE over the global
batch, on trimmed clips (one per action span of
CharadesEgo_v1_train_only1st.csv, its text the class name), 16 frames per
span, AdamW for 10 epochs. Evaluated every epoch on the untrimmed test
videos as a zero-shot classifier of the 157 class names
(`eval/charades_ego/mAP`), the best checkpoint by it. `:debug`: tiny, 2
steps on the synthetic corpus's Charades-Ego files (CPU).

One 8-GPU machine (64 clips per GPU: LaViLa's global batch of 512; the files
and the chunks: docs/recipes.md):

    C=/data/CharadesEgo
    python -m vidjax.main --config configs/charades_ego_ft.py \
        --workdir /runs/charades_ego_ft \
        --config.init_from=/runs/clip_vitb16_ego4d_epoch1 \
        --config.data.root=/data/charades_chunks \
        --config.data.train_annotations=$C/CharadesEgo_v1_train_only1st.csv \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz \
        --config.eval.sets.charades_ego.data.eval_annotations=$C/CharadesEgo_v1_test_only1st.csv

`init_from`: LaViLa starts from its FIRST-epoch pretraining checkpoint (not
its best). Zero-shot, no training: the same command with `--mode eval`.

LaViLa's reported numbers (not ours): Charades-Ego mAP 33.7 (TSF-B) / 36.1
(TSF-L) fine-tuned; zero-shot 26.8 / 28.9, from the epoch-1 checkpoints (its
MODEL_ZOO.md). The numbers to beat per benchmark: docs/scoreboard.md.
"""

import ml_collections

from vidjax.config import defaults, recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = recipe.variants(arg, ("debug",))
  c = defaults.base_config("contrastive")
  c.data.update(
    format="charades_ego_trimmed",
    num_frames=16,  # --clip-length 16, over each span (--sparse-sample)
    hflip=0.0,
    workers=16,
    threads=4,
  )
  # 47 GiB per GPU at 64 clips (`python -m benchmarks.memory --config
  # configs/charades_ego_ft.py`: 27 / 98 / 177 clips fit 24 / 80 / 141 GB;
  # "save_attention" 69 / 247 / 447).
  c.model.update(drop_path=0.1, remat="save_dots_and_attention")
  c.batch_size = 8 * 64
  # 10 epochs of the trimmed clips found at start-up (their number is the
  # training CSV's action spans): total_steps is set from them then.
  c.total_epochs = 10.0
  c.total_steps = 1  # Replaced at start-up (total_epochs > 0).
  c.optim.update(
    lr=3e-5,
    min_lr=1e-5,
    b2=0.999,
    eps=1e-8,
    weight_decay=0.01,
  )
  c.eval.update(every_epochs=1.0, batch_size=8 * 16)
  c.eval.sets.charades_ego = defaults.benchmark_set("charades_ego")
  c.checkpoint.update(every_epochs=1.0, best_metric="eval/charades_ego/mAP")
  if "debug" in variants:
    recipe.debug_on_synthetic(c)
    recipe.tiny_model(c)
    c.total_epochs = c.eval.every_epochs = c.checkpoint.every_epochs = 0.0
  return c
