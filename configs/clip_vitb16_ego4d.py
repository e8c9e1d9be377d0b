r"""Video-text CLIP ViT-B/16 on Ego4D narrations: AVION's baseline dual-encoder.

What it trains: a 4-frame video ViT-B/16 and CLIP's 12-layer text tower,
both initialised from OpenAI's CLIP ViT-B/16, with the symmetric InfoNCE loss
over the global batch of 2048 clip-narration pairs, for 5 epochs of the ~4.0M
Ego4D narration clips at a constant learning rate (AVION's `--fix-lr`), with
a frozen temperature of 0.07. The projections to the joint space (256-d) are
trained from scratch, as in AVION (OpenAI's 512-d ones are not loaded).

Data, once:

    # Ego4D videos -> 15 s chunks, short side 288 (AVION's videos_288px_15sec)
    python -m vidjax.data.chunk /data/ego4d/v1/full_scale /data/ego4d_chunks \
        --chunk-seconds 15 --short-side 288 --workers 16
    # LaViLa's narration pickle -> JSONL (unpickling runs code: trust the file)
    python -m vidjax.data.annotations convert-ego4d \
        /data/ego4d_train.pkl /data/ego4d_train.jsonl --allow-pickle
    python -m vidjax.data.annotations convert-ego4d \
        /data/ego4d_val.pkl /data/ego4d_val.jsonl --allow-pickle
    head -n 4096 /data/ego4d_val.jsonl > /data/ego4d_val_4k.jsonl

One 8-GPU machine (batch 256 per GPU, as AVION):

    python -m vidjax.main --config configs/clip_vitb16_ego4d.py \
        --workdir /runs/clip_vitb16_ego4d \
        --config.init_from=/weights/ViT-B-16.pt \
        --config.data.root=/data/ego4d_chunks \
        --config.data.train_annotations=/data/ego4d_train.jsonl \
        --config.data.eval_annotations=/data/ego4d_val_4k.jsonl \
        --config.data.vocab=/weights/bpe_simple_vocab_16e6.txt.gz

Every path is the user's to give (they default to ''): `init_from` is
OpenAI's `ViT-B-16.pt` (without it the run trains from scratch, which is not
AVION's recipe), `vocab` CLIP's BPE vocabulary. The format 'ego4d' reads the
converted JSONL and refuses pickles unless `data.allow_pickle=True`. The
evaluation is video<->text recall on held-out narrations (`eval/t2v_r1`,
`eval/v2t_r1`, `eval/chance_r1`): keep that file to a few thousand clips,
since the similarity matrix is N x N. With less GPU memory, choose a
leaner `model.remat` (see `get_config`) or raise `accum_steps` (the global
batch stays 2048).

AVION's reported numbers (not ours): EK-100 MIR zero-shot average mAP 27.4
(README) and 27.5 / 28.4, average nDCG 29.1 / 29.5 (docs/MODEL_ZOO.md, its two
figures), after ~130 GPU-hours on 8x NVIDIA A5000 (24 GB), 2x Xeon Gold
5220R (96 threads), 19 GB of GPU memory at 256 clips per GPU.

Hyper-parameters: AVION docs/MODEL_ZOO.md (launch command) and
scripts/main_lavila_pretrain.py (argparse defaults); see `get_config`.
`configs/clip_vitb16_ego4d.py:debug` runs the same task and model family,
tiny, for 2 steps on the synthetic corpus (CPU, tests).
"""
import ml_collections

from vidjax import config as config_lib, models, optim
from vidjax.data import pipeline

# LaViLa's ego4d_train.pkl: "Corpus size 4.0M" (AVION docs/MODEL_ZOO.md).
# Set total_steps yourself if your narration file differs.
EGO4D_TRAIN_CLIPS = 4_000_000
GPUS, BATCH_PER_GPU, EPOCHS = 8, 256, 5
BATCH = GPUS * BATCH_PER_GPU  # 2048
STEPS_PER_EPOCH = EGO4D_TRAIN_CLIPS // BATCH  # 1953 (drop_last, as AVION)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "contrastive"
  c.total_steps = EPOCHS * STEPS_PER_EPOCH  # 9765
  c.batch_size = BATCH
  c.accum_steps = 1
  c.fsdp = 1
  c.resume = ""
  c.init_from = ""  # OpenAI CLIP ViT-B-16.pt (AVION: --pretrain-zoo openai).
  # Fresh 256-d projections and the fixed 1/0.07 temperature, as AVION.
  c.init_keep = ("visual.proj", "text.proj", "logit_scale")
  c.peak_tflops = 0.0  # Per device; 0 = look the device kind up.

  c.data = pipeline.default_data_config()
  c.data.update(
      format="ego4d", allow_pickle=False,
      # --clip-length 4: one frame from each of 4 equal segments, jittered.
      num_frames=4, sampling="segment", size=224,
      # Fused decode + RandomResizedCrop(224, scale=(0.5, 1.0)), no flip.
      crop="random_resized", crop_scale=(0.5, 1.0), hflip=0.0,
      # AVION: 8 loader processes per GPU; 16 x 4 threads decode as many.
      workers=16, threads=4, device_prefetch=2)

  c.model = models.default_model_config("clip")
  c.model.update(
      variant="B/16", image_size=224, num_frames=4, tubelet=1,
      embed_dim=256,  # --project-embed-dim 256 (fresh projections).
      act="quick_gelu", drop_path=0.0,  # --drop-path-rate 0
      learn_logit_scale=False,  # --freeze-temperature: stays at 1/0.07.
      # GPU memory at 256 clips per GPU, by remat policy (upper bounds,
      # `python -m vidjax.bench.memory --config configs/clip_vitb16_ego4d.py`):
      # none 134 GiB, save_dots_and_attention 45, save_attention 15, full 12
      # (AVION's --grad-checkpointing, for its 24 GB cards). The default,
      # which recomputes only elementwise work, fits 80 GB GPUs; on 141 GB
      # try "none" (launch/gpu_check.sh measures both); on 24-48 GB use
      # "save_attention".
      remat="save_dots_and_attention",
      dtype="auto", attention="auto")

  c.optim = optim.default_optim_config()
  c.optim.update(
      name="adamw", lr=3e-5, schedule="constant", warmup_steps=0,  # --fix-lr
      b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, clip_grad_norm=0.0,
      # AVION decays every >= 2-d weight except positional tables.
      no_decay_names=("pos_embed", "spatial_pos"))

  c.augment = ml_collections.ConfigDict(dict(hflip=False))  # CLIP mean/std.
  c.eval = ml_collections.ConfigDict(dict(
      every_steps=STEPS_PER_EPOCH, batch_size=1024, relevancy=""))
  c.checkpoint = ml_collections.ConfigDict(dict(every_steps=1000, keep=2))
  c.log = ml_collections.ConfigDict(dict(every_steps=10))

  if arg == "debug":
    _debug(c)
  elif arg:
    raise ValueError(f"configs/clip_vitb16_ego4d.py: unknown variant {arg!r} "
                     "(try :debug)")
  return c


def _debug(c: ml_collections.ConfigDict) -> None:
  """2 steps of a tiny model on the synthetic corpus, on CPU."""
  config_lib.debug_on_synthetic(c, format="jsonl")
  c.model.update(variant="Ti/16", width=64, depth=2, heads=2, image_size=64,
                 num_frames=4, embed_dim=64, remat="none", dtype="float32")
  c.model.text.update(vocab_size=1024, width=64, heads=2, layers=2)
