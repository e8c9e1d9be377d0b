"""A run's start-up in two steps, each reading what it needs once.

    plan = resolve(config, workdir, splits=("train", "eval"))
    run = build(plan)   # then `train.setup` writes what the run accepted

`resolve` decides the run: the config (a copy; the caller's is left as
given) made absolute and validated, the data files, vocabulary and
annotations checked, which settle what the files decide
(`model.text.vocab_size`, `model.num_classes`, the `*_epochs` keys turned
into steps); then where the run starts (`resume.resolve_start`, which opens
a checkpoint's directory once and keeps it open on the start point) and the
weights' facts (`models.facts.settle`: what a checkpoint or `init_from` was
trained with). Then the config is locked (`config.lock`): nothing reads a
value that a later phase changes.

`build` makes the run from the plan: the abstract state and steps built
once (one abstract model) and used three times: by the memory check
(`vidjax.memory`), by the check that a checkpoint fits (`resume.check_fits`)
and as the restore's target. A checkpoint is restored into it, its arrays
verified as the restore reads them (`resume.restore`); else the
initializers run (`init_from` then fills the parameters). With 'train' the
training batches are set up at their saved position.

Everything a user can get wrong is checked here, before the run writes to
its workdir (only a synthetic corpus, which the checks read, is written
before: WORKDIR/synthetic).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flax import nnx
import jax
import ml_collections

from vidjax import (
  config as config_lib,
  memory,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.base import errors, stopping
from vidjax.checkpoints import resume, teacher as teacher_lib
from vidjax.config import defaults
from vidjax.data import checks, pipeline, synthetic, tokenizer as tokenizer_lib
from vidjax.evaluation import eval_sets, feature_cache
from vidjax.weights import facts, init_from


@dataclasses.dataclass
class Plan:
  """What `resolve` decided: the locked config and where the run starts.

  `reports` are the annotation checks of `splits` (`data.checks`);
  `source` what the start brings before the model is built
  (`resume.read_start`), `settled` the model keys it set. `close` closes
  the start's checkpoint directory.
  """

  config: config_lib.LockedConfig
  workdir: Path
  splits: tuple[str, ...]
  start: resume.StartPoint
  tokenizer: tokenizer_lib.Tokenizer | None
  reports: dict
  source: init_from.Source | None
  settled: list[str]
  teacher: init_from.Source | None = None  # A distilled student's.

  def close(self) -> None:
    self.start.close()


@dataclasses.dataclass
class Run:
  """What a run is built from: devices, task, jitted steps, and its state.

  `state` is the train state {step, params, opt}: its one copy, which the
  loop replaces at each step and evaluations read. `rest` is the model's
  state that is not trained (nnx buffers). `config` is the run's locked
  config.
  """

  config: config_lib.LockedConfig
  mesh: jax.sharding.Mesh
  task: tasks.Task
  tokenizer: tokenizer_lib.Tokenizer | None  # Video-text tasks only.
  state: dict
  rest: nnx.State
  steps: steps_lib.Steps
  data_state: dict | None = None  # Where the training batches resume.
  rng: jax.Array | None = None  # The checkpoint's base key; None: `seed`.
  workdir: Path | None = None  # Where evaluations save embeddings.
  train_records: list | None = None  # Checked rows; None: from the file.
  start: resume.StartPoint = resume.StartPoint("scratch")
  train_batches: pipeline.Pipeline | None = None  # With "train" in splits.
  # Config keys changed since the checkpoint (key, saved, now), accepted.
  changed: list = dataclasses.field(default_factory=list)
  init_report: init_from.Report | None = None  # 'init_from' only.


def resolve(
  config: ml_collections.ConfigDict,
  workdir: Path,
  *,
  splits: tuple[str, ...] = (),
) -> Plan:
  """The run's config, settled and locked, and where it starts.

  In the order the facts become known: the config (its paths made
  absolute), whether the attention configured can run (a GPU whose
  attention falls back to XLA is warned about), the data paths, the
  vocabulary, the annotation files of `splits` ('train', 'eval'; none for
  tools on synthetic batches), the start point and the weights' facts.

  Raises:
    errors.Error: what the user can fix, named (nothing is written).
  """
  config = config_lib.copy(config)
  config_lib.make_paths_absolute(config)
  config_lib.validate(config, jax.device_count())
  memory.check_attention(config)
  synthetic.prepare(config, workdir)
  stopping.check()  # Between the phases: a SIGTERM/Ctrl-C stops here.
  if splits:
    _check_start_up(config, splits)
  needs_text = defaults.needs_text(config.task)
  tokenizer = checks.load_tokenizer(config) if needs_text else None
  reports = (
    checks.check_annotations(
      config,
      splits,
      needs_text=needs_text,
      needs_label=config.task == "classification",
    )
    if splits
    else {}
  )
  if reports:
    checks.check_chunk_files(config, reports)
    checks.stop_if_unusable(reports, config, workdir)
  if "train" in reports:  # `*_epochs` keys count epochs of these records.
    config_lib.epochs_to_steps(config, len(reports["train"].kept_records()))
  stopping.check()
  start = resume.resolve_start(workdir, config)
  try:
    # What the weights were trained with (activation, LayerNorm eps,
    # pooling, temperature) decides the model where the command line does
    # not.
    source = resume.read_start(start, allow_pickle=config.init_allow_pickle)
    settled = facts.settle(config, source)
    # A distilled student's frozen teacher: its sizes and checksum.
    teacher = teacher_lib.read(config) if config.task == "distill" else None
    if teacher is not None:
      settled += teacher_lib.settle(config, teacher)
  except BaseException:
    start.close()
    raise
  return Plan(
    config_lib.lock(config),
    workdir,
    splits,
    start,
    tokenizer,
    reports,
    source,
    settled,
    teacher,
  )


def build(plan: Plan) -> Run:
  """The run of a plan: its state (restored or initialised) and steps.

  The abstract state is built once: it sizes the training step
  (`memory.check_step_fits`, with 'train'), is what a checkpoint must fit
  (`resume.check_fits`) and is the restore's target. With 'train' the
  training batches are set up at their saved position (`run.train_batches`,
  to close), refusing one that does not fit.
  """
  config = plan.config
  mesh, task, (state, rest, steps) = build_abstract(config)
  fitted = None
  if plan.start.kind == "init_from":  # Before compiling: weights that misfit.
    fitted = init_from.fit_params(
      state["params"],
      config.model,
      plan.source,
      keep_init=tuple(config.init_keep),
    )
  if "train" in plan.splits:  # Before compiling: a step that cannot fit.
    memory.check_step_fits(config, built=(state, rest, steps))
  stopping.check()
  run = Run(
    config,
    mesh,
    task,
    plan.tokenizer,
    state,
    rest,
    steps,
    workdir=plan.workdir,
    start=plan.start,
  )
  start = plan.start
  if start.kind in ("workdir", "resume"):
    run.start, restored, run.changed = resume.restore(
      start, state, config, training="train" in plan.splits
    )
    run.state, run.data_state = restored.state, restored.data_state
    run.rng = restored.rng
    run.rest = steps_lib.initial_state(config, state, rest, buffers_only=True)
  else:
    run.state, run.rest = steps_lib.initial_state(config, state, rest)
  if plan.teacher is not None:  # Frozen: in `rest`, never trained or saved.
    run.rest, _ = teacher_lib.load(run.rest, plan.teacher)
  if start.kind == "init_from":  # Parameters only, onto their shardings.
    values, run.init_report = fitted
    params = init_from.place_params(run.state["params"], values)
    run.init_report.settled = plan.settled
    run.state = dict(run.state, params=params)
  if "train" in plan.reports:
    run.train_records = plan.reports["train"].kept_records()
  stopping.check()
  if "train" in plan.splits and run.train_records and config.model.get("probe"):
    # A probe trains on its frozen encoder's features, cached by the first
    # batch it asks for.
    run.train_batches = feature_cache.FeatureBatches(
      run, config, run.data_state
    )
  elif "train" in plan.splits and run.train_records:
    # Before anything is written: refuses a saved data position that does
    # not fit. (No rows left: `checks.report` says why.)
    run.train_batches = pipeline.make_pipeline(
      config,
      run.mesh,
      train=True,
      batch_size=config.batch_size,
      tokenizer=run.tokenizer,
      records=run.train_records,
      state=run.data_state,
    )
  return run


def build_abstract(config, devices=None) -> tuple:
  """The run's mesh, task and abstract (state, rest, steps), as `build`
  makes them: nothing computed or allocated (`steps.build_state_and_steps`
  with `abstract=True`).

  Args:
    config: the run config, settled.
    devices: the mesh's devices; default every device here
      (`vidjax.compile` passes a GPU topology's, to compile for it).
  """
  mesh = sharding.make_mesh(fsdp=config.fsdp, devices=devices)
  task = tasks.get_task(config.task)
  built = steps_lib.build_state_and_steps(config, task, mesh, abstract=True)
  return mesh, task, built


def _check_start_up(config, splits: tuple[str, ...]) -> None:
  """What the config alone decides, said together in one run before any file
  is read or anything compiled: the files `splits` read (every unset or
  missing path), pickles without the opt-in, and, with either, whether the
  training step fits this machine (a GPU recipe typed on a CPU).

  Raises:
    errors.ConfigError: every problem found, each with its hint (one
      problem: its own error).
  """
  found: list[errors.UserError] = []
  try:
    _check_files(config, splits)
  except errors.PathError as e:
    found.append(e)
  pickles = [
    f"data.{k}"
    for k in ("train_annotations", "train_relevancy")
    if "train" in splits
    and str(config.data[k]).endswith(".pkl")
    and not config.data.allow_pickle
  ]
  if pickles:
    found.append(
      errors.ConfigError(
        f"{' and '.join(pickles)} name pickles: unpickling can run code "
        "stored in a file",
        hint="pass --config.data.allow_pickle=True if you trust them, or "
        "convert them once (python -m vidjax.data.annotations convert-ego4d "
        "SRC OUT --allow-pickle)",
      )
    )
  if found and "train" in splits:
    # Sizes the data decide later (0: the vocabulary's, the labels'): CLIP's
    # vocabulary and one class, for the estimate only.
    sized = config_lib.copy(config)
    text = sized.model.get("text")
    if text is not None and not text.vocab_size:
      text.vocab_size = defaults.VOCAB_SIZE
    if "num_classes" in sized.model and not sized.model.num_classes:
      sized.model.num_classes = 1
    try:  # Abstract: seconds, nothing compiled.
      memory.check_step_fits(sized)
    except errors.UserError as e:
      found.append(e)
  if len(found) == 1:
    raise found[0]
  if found:
    raise errors.ConfigError(
      f"{len(found)} things to fix before this run can start:\n"
      + "\n".join(
        f"{i}. " + e.describe().replace("\n", "\n   ")
        for i, e in enumerate(found, 1)
      )
    )


def _check_files(config, splits: tuple[str, ...]) -> None:
  """The files that `splits` read exist (and the evaluation files fit)."""
  actions = config.data.format == "ek100_cls" and config.data.label == "action"
  if actions and not config.data.train_annotations:
    raise errors.ConfigError(
      "data.train_annotations is unset: with data.format='ek100_cls' and "
      "data.label='action', the action ids are numbered over the training "
      "and validation CSVs together (as the head was trained), also to "
      "evaluate",
      hint="set --config.data.train_annotations to EPIC_100_train.csv",
    )
  keys = [
    k
    for k in eval_sets.required_paths(config, needs_text=False)
    if "train" in splits
    or not k.startswith("data.train_")
    or (actions and k == "data.train_annotations")
  ]
  checks.check_paths(config, keys)
  if "eval" in splits:
    eval_sets.check_files(config)
