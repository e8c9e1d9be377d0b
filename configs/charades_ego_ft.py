r"""Charades-Ego: fine-tune the dual encoder on action clips, score it as a
classifier (LaViLa's protocol).

What it trains: the whole video-text CLIP of `clip_vitb16_ego4d.py` with
the symmetric InfoNCE loss over the global batch, on trimmed clips (one per
action span of CharadesEgo_v1_train_only1st.csv, its text the class name),
16 frames sampled over each span, random-resized crops (scale 0.5-1), AdamW
(lr 3e-5, betas 0.9/0.999, eps 1e-8, weight decay 0.01) for 10 epochs of
the clips found at start-up, cosine to 1e-5 (LaViLa warms up for 1 epoch:
`--config.optim.warmup_steps=` the epoch's steps, which start-up logs). Evaluation every epoch (`--eval-freq 1`) on the
untrimmed test videos (CharadesEgo_v1_test_only1st.csv), 16 frames sparse
over each whole video, one centre crop, as a zero-shot classifier of the
157 class names (`vidjax.evaluation.zeroshot`): `eval/charades_ego/mAP` (videos
without a label do not count), the best checkpoint by it.

Files, as Charades-Ego ships them: the videos `CharadesEgo_v1_480/<id>.mp4`
and, beside each other, `CharadesEgo_v1_train_only1st.csv`,
`CharadesEgo_v1_test_only1st.csv` (columns `id`, `actions` as `cNNN start
end;...`, `length`) and `Charades_v1_classes.txt` (`cNNN name`; or
`data.classes`).

Data, once:

    python -m vidjax.data.chunk /data/CharadesEgo_v1_480 /data/charades_chunks \
        --chunk-seconds 15 --short-side 320 --workers 16

One 8-GPU machine (64 clips per GPU: LaViLa's global batch of 512):

    C=/data/CharadesEgo
    python -m vidjax.main --config configs/charades_ego_ft.py \
        --workdir /runs/charades_ego_ft \
        --config.init_from=/runs/clip_vitb16_ego4d_epoch1 \
        --config.data.root=/data/charades_chunks \
        --config.data.train_annotations=$C/CharadesEgo_v1_train_only1st.csv \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz \
        --config.eval.sets.charades_ego.data.eval_annotations=$C/CharadesEgo_v1_test_only1st.csv

`init_from`: LaViLa starts Charades-Ego from its FIRST-epoch pretraining
checkpoint (not its best; keep it with `checkpoint.every_steps` at one epoch),
a vidjax run, a step directory, or AVION's / LaViLa's released dual encoder.
Zero-shot, no training: the same command with `--mode eval`.

LaViLa's reported numbers (not ours): Charades-Ego mAP 33.7 (TSF-B) / 36.1
(TSF-L) fine-tuned; zero-shot 26.8 / 28.9, from the epoch-1 checkpoints
(docs/MODEL_ZOO.md). LaViLa trains on its own filtered list of trimmed clips
(`metadata_filtered_train.pkl`); this recipe takes every action span of the
released training CSV.

`configs/charades_ego_ft.py:debug`: the same task, layouts and evaluation,
tiny, 2 steps on the synthetic corpus's Charades-Ego files (CPU).
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
