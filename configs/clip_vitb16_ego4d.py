r"""Video-text CLIP ViT-B/16 on Ego4D narrations: AVION's dual-encoder pretraining.

What it trains: a 4-frame video ViT-B/16 and CLIP's 12-layer text tower,
both initialised from OpenAI's CLIP ViT-B/16, with the symmetric InfoNCE loss
over the global batch of 2048 clip-narration pairs, for 5 epochs of the ~4.0M
Ego4D narration clips at a constant learning rate (AVION's `--fix-lr`), with
a frozen temperature of 0.07. The projections to the joint space (256-d) are
trained from scratch, as in AVION (OpenAI's are 512-d: they do not fit and
start fresh; continuing an AVION pretraining loads its 256-d ones and its
temperature).
`configs/clip_vitb16_ego4d.py:lavila` is AVION's LLM-augmented (LaViLa)
pretraining instead: the same model on LaViLa's rephrased and narrator-
generated narrations (see below).

Optional zero-shot sets, every epoch (skipped while their files are unset;
`vidjax.evaluation.scoreboard`): EgoMCQ (`eval/egomcq/inter_video`, `.../intra_video`,
`--config.eval.sets.egomcq.data.eval_annotations=egomcq.json` on the Ego4D
chunks), EGTEA (`eval/egtea/mean_class_acc`, test_split1.txt on the
chunked cropped_clips), Charades-Ego (`eval/charades_ego/mAP`,
CharadesEgo_v1_test_only1st.csv on the chunked CharadesEgo_v1_480) and
EK-100 CLS (`eval/ek100_cls/top1`, EPIC_100_validation.csv with
`data.train_annotations=EPIC_100_train.csv`); each set's `data.root` is its
chunk store.

Evaluation, every epoch: video<->text recall on held-out Ego4D narrations
(`eval/t2v_r1`, `eval/v2t_r1`, `eval/chance_r1`) and, as AVION evaluates
and selects its pretraining, zero-shot EK-100 multi-instance retrieval on
the 9,668 test clips x 3,842 captions (`eval/ek100_mir/mAP_avg`,
`eval/ek100_mir/nDCG_avg`, ...; the `eval.sets.ek100_mir` set, skipped while
its files are unset). Keep the checkpoint with the best
`eval/ek100_mir/mAP_avg` for fine-tuning.

Files, in the names the datasets ship them:
  Ego4D videos (v1/full_scale/<video_uid>.mp4)
  LaViLa's narration pickles (dl.fbaipublicfiles.com/lavila/metadata/ego4d/):
    ego4d_train.pkl, ego4d_val.pkl; for :lavila also
    ego4d_train.rephraser.no_punkt_top3.pkl and
    ego4d_train.narrator_63690737.return_10.pkl
  ViT-B-16.pt (OpenAI CLIP), bpe_simple_vocab_16e6.txt.gz
  for the zero-shot EK-100 evaluation: EK-100 videos,
    retrieval_annotations/EPIC_100_retrieval_test.csv,
    EPIC_100_retrieval_test_sentence.csv and
    caption_relevancy_EPIC_100_retrieval_test.pkl (see `ek100_mir_ft.py`)

Data, once:

    # Ego4D videos -> 15 s chunks, short side 288 (AVION's videos_288px_15sec)
    python -m vidjax.data.chunk /data/ego4d/v1/full_scale /data/ego4d_chunks \
        --chunk-seconds 15 --short-side 288 --workers 16
    # or as a SLURM array of 8 shards (BENCHMARKS.md: hours for N machines),
    # then --merge when --status says every shard is finished:
    #   sbatch --array=1-8 launch/chunk_slurm.sh /data/ego4d/v1/full_scale \
    #       /data/ego4d_chunks
    #   python -m vidjax.data.chunk --merge /data/ego4d_chunks
    # LaViLa's narration pickles -> JSONL (unpickling runs code: trust them)
    for f in ego4d_train ego4d_val ego4d_train.rephraser.no_punkt_top3 \
             ego4d_train.narrator_63690737.return_10; do
      python -m vidjax.data.annotations convert-ego4d \
          /data/$f.pkl /data/$f.jsonl --allow-pickle
    done
    head -n 4096 /data/ego4d_val.jsonl > /data/ego4d_val_4k.jsonl
    # EK-100 chunks and test relevancy: as in ek100_mir_ft.py.

One 8-GPU machine (batch 256 per GPU, as AVION):

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

LLM-augmented (`:lavila`): the same command with
`configs/clip_vitb16_ego4d.py:lavila` and both of LaViLa's files,
comma-separated, concatenated as AVION's `ConcatDataset` does:

        R=/data/ego4d_train.rephraser.no_punkt_top3.jsonl
        N=/data/ego4d_train.narrator_63690737.return_10.jsonl
        --config.data.train_annotations=$R,$N

Their narrations are lists; each training element draws one with its own
random generator (the same data for any number of workers, and on resume).

Every path is the user's to give (they default to ''): `init_from` is
OpenAI's `ViT-B-16.pt` (without it the run trains from scratch, which is not
AVION's recipe), `vocab` CLIP's BPE vocabulary. The format 'ego4d' reads the
converted JSONL and refuses pickles unless `data.allow_pickle=True`. Keep the
Ego4D evaluation file to a few thousand clips, since its similarity matrix is
N x N. With less GPU memory, choose a leaner `model.remat` (see
`get_config`) or raise `accum_steps`: the global batch stays 2048 and so
does the loss, InfoNCE over all 2048 pairs (each clip still sees 2047
negatives), its gradients those of the unsplit batch, at the cost of one
more forward pass (4/3 the FLOPs; GradCache, see `vidjax.steps`). One H200
takes the whole recipe that way: `--config.accum_steps=4`, 512 clips at a
time, about 88 GiB by the estimate (`python -m benchmarks.memory
--batch-per-device 2048 --accum-steps 4`), and the cached embeddings 8 MiB.

The run evaluates zero-shot EK-100 MIR every `eval.every_steps`
(`eval.sets.ek100_mir`) and keeps its best checkpoint by
`checkpoint.best_metric`, `eval/ek100_mir/mAP_avg` as in AVION (recorded in
WORKDIR/checkpoints/best.json, kept whatever `checkpoint.keep` says);
`--config.init_from=/runs/clip_vitb16_ego4d` in the fine-tuning recipes
loads that one (else the latest). Without the EK-100 files the set is
skipped (said at start-up): then point `checkpoint.best_metric` at
`eval/t2v_r1`. Zero-shot MIR alone, no
training: `configs/ek100_mir_ft.py` with `--mode eval`, 4 frames and
`--config.init_from=/runs/clip_vitb16_ego4d` (see its docstring). The whole
chain, pretraining to fine-tuning: README, "The AVION chain".

The model computes what its weights were trained with, read from them
(WORKDIR/init_from.json lists it): QuickGELU and LayerNorm eps 1e-5 from
OpenAI's `ViT-B-16.pt`; exact GELU, eps 1e-6 in the vision tower (1e-5 in
the text tower) and its temperature from an AVION checkpoint. Matching
AVION's code exactly, which runs exact GELU and eps 1e-6 on OpenAI's
QuickGELU weights (its `use_quick_gelu=True` is swallowed by `**kwargs`):
add `--config.model.act=gelu --config.model.ln_eps=1e-6
--config.init_allow_mismatch=True` (without the last, a value that
disagrees with the weights stops the run, naming both). The released
`ViT-B-16.pt` is a TorchScript archive: it is read as such, and pickled
files run no code unless `--config.init_allow_pickle=True`.

AVION's reported numbers (not ours), zero-shot EK-100 MIR: baseline average
mAP 27.4 (README) and 27.5 / 28.4, average nDCG 29.1 / 29.5
(docs/MODEL_ZOO.md, its two figures), after ~130 GPU-hours; `:lavila`
average mAP 33.2 (README) and 31.1 / 32.9, average nDCG 31.9 / 32.7
(MODEL_ZOO), after ~260 GPU-hours, and from it EK-100 MIR fine-tuning 52.0
mAP / 66.5 nDCG and EK-100 action top-1 49.5. 8x NVIDIA A5000 (24 GB), 2x
Xeon Gold 5220R (96 threads), 19 GB of GPU memory at 256 clips per GPU.

Masked training, `configs/clip_vitb16_ego4d.py:flip` (not AVION's; joins
the others, e.g. `:lavila,flip`): the video tower drops a random half of
each clip's 784 patch tokens in training (`model.mask_ratio=0.5`, after
the positions are added; the class token is kept), so each training clip
costs 0.49x the FLOPs (238 instead of 489 GFLOP: the vision tower's 393
tokens, attention's quadratic part a quarter; `vidjax.models.flops`) and
keeps 0.53x the memory for its backward pass (91 instead of 170 MiB under
the default remat). FLIP spends that memory on the batch: `:flip` trains
at 4096 clips (2 x AVION's 2048, each seeing 4095 negatives), the
learning rate scaled with it (6e-5), for the same 5 epochs (4880 steps,
about half AVION's compute). The last 1% of the steps train on every token
(`unmask_fraction=0.01`, the unmasked tuning) at FLIP's 1/100 of the rate
(`unmask_lr=6e-7`) after a warmup of a tenth of them
(`unmask_warmup_steps`), in 2 microbatches of the same 4096 (GradCache:
the loss stays the whole batch's; `unmask_accum_steps=2`). The batch it is
meant for, by the memory estimate (`python -m benchmarks.memory`; the
check at start-up sizes the masked step and the tuning's apart):
  8 x 24 GiB (AVION's A5000s), 512 clips per GPU: `--config.model.remat=
    save_attention`, masked 16.5 GiB, the tuning's 256-clip microbatches
    16.0 GiB, of ~21.6 usable;
  one H200 (~113 GiB usable), all 4096: `--config.accum_steps=4
    --config.unmask_accum_steps=8`, masked 1024 clips at a time 93.8 GiB,
    the tuning 512 at a time 88.0 GiB (the default remat; 16 MiB of cached
    embeddings each).
Evaluation, the text tower and `init_from` are unchanged: OpenAI's and
AVION's weights load as they are. The loader must deliver about twice the
clips per second (README, "Masked training").
  For and against masking at this data scale: FLIP's gain comes from the
  larger batch its memory buys (Table 1a, ViT-L/16 on LAION-400M: 50%
  masking at a 32k batch 69.6 against 68.6 unmasked at 16k; at an equal
  batch 68.5 against 68.6), on 400M pairs; Ego4D has ~4M clips, a hundred
  times fewer, where seeing every token may matter more than more pairs
  per second. On `configs/demo.py` (a tiny model whose text tower is 46%
  of the FLOPs, so masking saves 20% there, not 50%) masking at about
  equal FLOPs was a wash at R@1 and worse at R@5/R@10 in each of 3 seeds.
  Published, not measured here: FLIP (Li et al., "Scaling Language-Image
  Pre-training via Masking", CVPR 2023) trains image CLIPs with 50% or 75%
  of the patches dropped, for 2-4x less computation per sample, and
  reports better accuracy and speed than without masking on LAION-400M;
  a short unmasked tuning (their released recipe: 1% of the pretraining's
  samples, at 1/100 of the base learning rate after a warmup) narrows the
  train/test shift masking leaves (ViT-L/16, 6.4 epochs, ImageNet
  zero-shot: 69.6 -> 70.1 at 50%, 68.2 -> 69.5 at 75%). MAC (Shu et al.,
  "Masked Contrastive Pre-Training for Efficient Video-Text Retrieval",
  2022) masks a high ratio of video (and text) tokens in video-text
  pretraining and reports 60% fewer FLOPs, 3x faster pretraining and
  better MSR-VTT, DiDeMo and ActivityNet retrieval.
  Not measured here yet: zero-shot EK-100 MIR after Ego4D pretraining with
  masking (against the 27.4-28.4 mAP above), and the GPU speed-up per step
  (`python -m benchmarks.masking` prints the FLOPs and a CPU step-time
  ratio).

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch commands) and
scripts/main_lavila_pretrain.py (argparse defaults); see `get_config`.
`configs/clip_vitb16_ego4d.py:debug` runs the same task, model family and
every evaluation set, tiny, for 2 steps on the synthetic corpus (CPU, tests);
`:flip,debug` the first of them masked, the second unmasked.
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
    # GPU memory at 256 clips per GPU, by remat policy (upper bounds,
    # `python -m benchmarks.memory --config configs/clip_vitb16_ego4d.py`):
    # none 134 GiB, save_dots_and_attention 45, save_attention 15, full 12
    # (AVION's --grad-checkpointing, for its 24 GB cards). The default,
    # which recomputes only elementwise work, fits 80 GB GPUs; "none"
    # does not fit even a 141 GB one (~113 GiB usable); on 24-48 GB use
    # "save_attention". A run refuses at start-up what will not fit.
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
  # zero-shot with the run's frames (README, "Benchmarks" for the papers'
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
