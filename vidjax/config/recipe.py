"""What recipes share: published schedules, `:arg` variants, `:debug`.

A recipe (configs/NAME.py) is `get_config(arg=None) -> ConfigDict`. It
starts from `vidjax.config.defaults.base_config(task)`, which holds every key a run
reads with its default, and states only what differs:

    from vidjax.config import defaults, recipe

    def get_config(arg=None):
      variants = recipe.variants(arg, ("debug",))
      c = defaults.base_config("classification")
      c.data.update(format="kinetics", sampling="stride", workers=16)
      c.model.num_classes = 400
      recipe.schedule(c, recipe.TRAIN_CLIPS["k400"], epochs=100,
                      batch_size=256)
      if "debug" in variants:
        recipe.debug_on_synthetic(c, format="jsonl")
        recipe.tiny_model(c, num_classes=48)
      return c

Top-level keys of the base config (sections are documented where they are
read):
  seed            seeds the parameters, the data order and the augmentations
  task            'contrastive' | 'retrieval' | 'mae' | 'classification' |
                  'distill'
  total_steps     optimizer steps of the run
  total_epochs    > 0: replaces total_steps by as many epochs of the checked
                  training records, at start-up (so do `eval.every_epochs`
                  and `checkpoint.every_epochs` for their `every_steps`)
  unmask_fraction with a CLIP's `model.mask_ratio` > 0: the last share of
                  total_steps trains on every video token (FLIP's unmasked
                  tuning; at least one step when > 0); 0 masks to the end
  unmask_lr       > 0: the unmasked tuning's own learning rate (FLIP's: 1/100
                  of the pretraining's), after a linear warmup from 0 over
                  `unmask_warmup_steps`, then as `optim.schedule` (cosine to
                  min_lr x unmask_lr / lr at total_steps, or constant); 0:
                  the pretraining's schedule runs on through the tuning
  unmask_accum_steps  microbatches of the unmasked tuning's step (0:
                  accum_steps): every token costs more memory per clip, the
                  global batch stays
  batch_size      global batch (all processes)
  accum_steps     microbatches per step (gradient accumulation)
  fsdp            devices each parameter is sharded over (1: replicated)
  resume          a run (workdir, checkpoints/ or step dir) to continue
                  when the workdir has no checkpoint yet
  init_from       weights to start from (`vidjax.weights.conversion`); what they
                  were trained with (activation, LayerNorm eps, pooling,
                  temperature) sets the model keys not given on the command
                  line (`vidjax.weights.facts`)
  init_allow_pickle  let `init_from` unpickle a file (runs its code)
  init_keep       parameter path prefixes not loaded from `init_from` even
                  if they fit (they keep their initial values)
  init_allow_mismatch  keep model keys given on the command line that differ
                  from what the weights were trained with (a warning, not
                  an error)
  overrides       the keys given as --config.KEY=VALUE (`load_config` sets
                  it): the user's, which the weights' facts never change
  peak_tflops     per device, for MFU; 0 looks the device kind up
  device_memory_gib  per device, for the start-up memory check
                  (`vidjax.memory`): 0 takes what a GPU reports (on a
                  CPU: the host's available memory over its devices), N
                  plans for N GiB, -1 checks nothing
  data            `vidjax.data.pipeline`
  model           `vidjax.models`, the task's model; `model.num_frames` and
                  `model.image_size` are references to `data.num_frames`
                  and `data.size`: set the data's
  optim           `vidjax.optim`
  augment         `vidjax.augment`
  loss            the retrieval task's: name ('max_margin', AVION's;
                  'relevancy_max_margin'; 'sms'), margin, threshold (SMS);
                  `vidjax.tasks.retrieval`
  eval            every_steps (0: only at the end), every_epochs,
                  batch_size, relevancy, sentences, save_embeddings,
                  kind, templates, views (the field's
                  benchmarks: `vidjax.evaluation.scoreboard`) and named `sets`
                  (`defaults.eval_set`, `defaults.benchmark_set`;
                  `vidjax.evaluation.eval_sets`)
  checkpoint      every_steps, every_epochs, keep (the last N), async_save,
                  best_metric ('' for none) and best_mode ('max' | 'min')
  log.every_steps metrics written every N steps
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_collections

# Training clips of the published data sets, as AVION counts them: the
# recipes' schedules assume these (`total_epochs` counts your own instead).
TRAIN_CLIPS = {
  "ego4d": 4_000_000,  # LaViLa's ego4d_train.pkl: "Corpus size 4.0M"
  "ek100": 67_217,  # EPIC_100_train.csv, EPIC_100_retrieval_train.csv rows
  "k400": 240_000,  # ~240k in VideoMAE's and AVION's lists
  "egtea": 8_299,  # EGTEA Gaze+ train_split1.txt rows
}


def schedule(
  config: ml_collections.ConfigDict,
  train_clips: int,
  *,
  batch_size: int,
  epochs: int,
  warmup_epochs: int = 0,
) -> int:
  """A published schedule in epochs, as steps of an assumed data set size.

  Sets `batch_size`, `total_steps` and `optim.warmup_steps` for `epochs`
  (`warmup_epochs`) of `train_clips` clips (e.g. `TRAIN_CLIPS['k400']`),
  the last partial batch of each epoch dropped, as AVION does.

  Returns:
    The steps per epoch, for the recipe's other per-epoch keys.
  """
  steps_per_epoch = train_clips // batch_size
  config.batch_size = batch_size
  config.total_steps = epochs * steps_per_epoch
  config.optim.warmup_steps = warmup_epochs * steps_per_epoch
  return steps_per_epoch


def variants(
  arg: str | None, known: Sequence[str], *, exclusive: Sequence[str] = ()
) -> set[str]:
  """The variants named by a recipe's `:arg`, joined by commas.

  Args:
    arg: what follows the colon of "configs/NAME.py:arg" (None: nothing).
    known: the recipe's variants.
    exclusive: variants of which at most one may be named.

  Returns:
    The named variants, e.g. {'labels', 'cpu'} for "labels,cpu".

  Raises:
    ValueError: an unknown variant, or two exclusive ones, naming the known.
  """
  named = {v.strip() for v in (arg or "").split(",") if v.strip()}
  unknown = sorted(named - set(known))
  clash = sorted(named & set(exclusive))
  if unknown or len(clash) > 1:
    what = (
      f"unknown variant {', '.join(map(repr, unknown))}"
      if unknown
      else f"variants {' and '.join(clash)} exclude each other"
    )
    several = (
      f" (join several with commas, e.g. :{known[-2]},{known[-1]})"
      if len(known) > 1
      else ""
    )
    raise ValueError(
      f"{what}; known variants: {', '.join(':' + k for k in known)}{several}"
    )
  return named


def debug_on_synthetic(config: ml_collections.ConfigDict, **data) -> None:
  """Turns a recipe into its `:debug` variant: 2 steps on CPU, synthetic data.

  The part every recipe's `:debug` shares: a small synthetic corpus written
  into the workdir, 4 frames of 64 px read by 2 threads, batch 16, a
  checkpoint at step 2, metrics every step, one final eval. `data` adds or
  overrides `config.data` keys (e.g. format="jsonl", stride=4). The recipe
  then shrinks its model with `tiny_model`.
  """
  config.total_steps = 2
  config.batch_size = 16
  config.data.update(dict(num_frames=4, size=64, workers=0, threads=2, **data))
  config.data.synthetic.update(enabled=True, num_videos=8, segment_seconds=2.0)
  config.eval.update(every_steps=0, batch_size=8)
  config.checkpoint.every_steps = 2
  config.log.every_steps = 1


def tiny_model(config: ml_collections.ConfigDict, **model) -> None:
  """The tiny float32 backbone of every `:debug` recipe and the demo (so
  that one's checkpoints initialise another's), its text tower and joint
  space as small; `model` adds or overrides `config.model` keys."""
  tiny = dict(
    variant="Ti/16", width=64, depth=2, heads=2, remat="none", dtype="float32"
  )
  if config.model.name == "clip":
    tiny["embed_dim"] = 64
    config.model.text.update(vocab_size=1024, width=64, heads=2, layers=2)
  config.model.update(dict(tiny, **model))
