"""The GPU check's device measurements: the plan, attention, training steps.

Each `check_*` returns one section of `benchmarks.gpu_check`'s JSON (its
docstring says what each measures); `Plan` holds the sizes, on a GPU or in
the CPU dry run; `step_plan` the training steps to measure, in order, with
the memory each is estimated to need (`vidjax.memory`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
import time
import traceback

import jax
import jax.numpy as jnp

from benchmarks import breakdown, cuda_trace, random_batches
from vidjax import (
  config as config_lib,
  memory,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.base import internals
from vidjax.data import batches
from vidjax.models import attention, flops as flops_lib, shapes
from vidjax.report import monitor

GiB = 2**30
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILE = CONFIGS / "clip_vitb16_ego4d.py"  # The step measured.
REL_TOLERANCE = 2e-2  # bf16 attention against float32: 1e-3 to 1e-2.
# Attention measured: name -> (recipe, tower). The CLIP step's two towers,
# 16-frame CLIP (EK-100 fine-tuning: 3137 tokens), VideoMAE's encoder
# (visible tokens) and decoder (every patch).
ATTENTION_CASES = {
  "clip_vision": ("clip_vitb16_ego4d", "vision"),
  "clip_text": ("clip_vitb16_ego4d", "text"),
  "clip_vision_16f": ("ek100_mir_ft", "vision"),
  "videomae_encoder": ("videomae_vitb_k400_pretrain", "vision"),
  "videomae_decoder": ("videomae_vitb_k400_pretrain", "decoder"),
}
# Policies measured after the recipe's own, while time remains and when
# their memory estimate fits: AVION's full remat, and nothing recomputed.
EXTRA_REMATS = ("none", "full")
DRY_TIME_LIMIT_S = 900.0


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sizes of one check: on a GPU, or the CPU dry run."""

  dry: bool
  config_arg: str  # configs/<recipe>.py[:arg]
  batch_per_device: int
  attention_batch: int  # At the CLIP vision shape; others as many tokens.
  warmup_steps: int
  timed_steps: int
  data_steps: int
  data_workers: int
  time_limit_s: float  # For the whole check.
  repeats: int = 10  # Timed calls per attention or matmul measurement.
  reserve_s: float = 90.0  # Kept for the sections after training.
  # The steps measured "if time remains" start only this long into the
  # check (None: while the time limit allows): a dry run's limit only stops
  # a hang, and its optional steps measure nothing a GPU run needs.
  optional_until_s: float | None = None


def make_plan(dry: bool, time_limit_s: float | None = None) -> Plan:
  """The sizes of the GPU check, or of its dry run on CPU.

  The GPU run's default time limit (330 s) fits in a short job slot with
  start-up; what does not fit is skipped or cut short, and the results say
  so. The dry run's (`DRY_TIME_LIMIT_S`) only stops a hang: it measures
  nothing, and a loaded CI machine may take minutes.
  """
  if dry:
    return Plan(
      dry=True,
      config_arg="debug",
      batch_per_device=2,
      attention_batch=2,
      warmup_steps=1,
      timed_steps=2,
      data_steps=4,
      data_workers=0,
      time_limit_s=time_limit_s or DRY_TIME_LIMIT_S,
      repeats=2,
      reserve_s=20.0,
      optional_until_s=60.0,
    )
  return Plan(
    dry=False,
    config_arg="",
    batch_per_device=256,
    attention_batch=64,
    warmup_steps=2,
    timed_steps=10,
    data_steps=30,
    data_workers=os.cpu_count() or 1,
    time_limit_s=time_limit_s or 330.0,
  )


def recipe_config(
  plan: Plan,
  recipe: str = "clip_vitb16_ego4d",
  attention_impl: str = "cudnn",
  **model,
):
  """configs/<recipe>.py (:debug when dry), bf16 on a GPU, with the
  attention implementation `attention_impl` (XLA in a dry run)."""
  spec = str(CONFIGS / f"{recipe}.py") + (
    f":{plan.config_arg}" if plan.config_arg else ""
  )
  config = config_lib.load_config(spec)
  config.model.update(
    dtype="float32" if plan.dry else "bfloat16",
    attention="xla" if plan.dry else attention_impl,
    **model,
  )
  config.data.synthetic.enabled = False  # :debug's; batches come from here.
  config.batch_size = plan.batch_per_device * jax.device_count()
  return config


def recipe_remat() -> str:
  """The CLIP recipe's own remat policy (its GPU configuration)."""
  return config_lib.load_config(str(CONFIG_FILE)).model.remat


def log(message: str) -> None:
  print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _is_oom(error: BaseException) -> bool:
  return internals.is_out_of_memory(error)


def error_text(error: BaseException) -> str:
  return f"{type(error).__name__}: {error}"[:1500]


def _peak_memory_gib() -> float | None:
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return peak / GiB if peak else None


def usable_memory_bytes() -> float | None:
  """What a step may use on this GPU (as `vidjax.memory` plans); None on
  a CPU."""
  stats = jax.devices()[0].memory_stats() or {}
  if jax.default_backend() != "gpu" or "bytes_limit" not in stats:
    return None
  return memory.usable_bytes(stats["bytes_limit"])


# ------------------------------------------------------------------------ plan
def step_plan(plan: Plan, remats: list[str] | None = None) -> dict:
  """The training steps to measure, in order, with their memory estimates.

  By default: the recipe's remat policy with cuDNN attention at the plan's
  batch; the same with XLA attention at the largest batch its estimate
  fits (a power of two); then `EXTRA_REMATS` with cuDNN while time remains,
  unless their estimate does not fit (left out, saying why). `remats`
  (--remat) replaces the cuDNN policies: measured in its order, none left
  out; the XLA step takes the first.

  Returns:
    dict: 'steps' (each with key 'attention/remat', attention, remat,
    batch_per_device, estimate_gib and why), 'left_out' {key: why},
    'usable_gib' (None on CPU) and 'estimate_error' (None, or why no
    estimate could be made: then nothing is left out).
  """
  usable = usable_memory_bytes()
  first = remats[0] if remats else recipe_remat()
  cudnn = list(dict.fromkeys(remats or [first, *EXTRA_REMATS]))
  estimates, error = {}, None
  try:
    # As on a GPU with cuDNN, whether or not this machine has one.
    with cuda_trace.forced_cudnn():
      config = recipe_config(plan)
      config.model.update(attention="cudnn", dtype="bfloat16")
      for estimate in memory.step_memories(config, cudnn):
        estimates["cudnn", estimate.remat] = estimate
    config = recipe_config(plan, attention_impl="xla")
    config.model.update(attention="xla", dtype="bfloat16")
    estimates["xla", first] = memory.step_memory(config, remat=first)
  except Exception as e:
    traceback.print_exc()  # The measurements still run, unfiltered.
    error = error_text(e)

  def gib(impl, remat, clips):
    estimate = estimates.get((impl, remat))
    return estimate.total_bytes(clips) / GiB if estimate else None

  xla_batch = plan.batch_per_device
  if usable and ("xla", first) in estimates:
    while xla_batch > 1 and gib("xla", first, xla_batch) * GiB > usable:
      xla_batch //= 2
  steps, left_out = [], {}
  for i, remat in enumerate(cudnn):
    need = gib("cudnn", remat, plan.batch_per_device)
    why = (
      "requested"
      if remats
      else "the recipe's policy"
      if i == 0
      else "if time remains"
    )
    if not remats and i and usable and need and need * GiB > usable:
      left_out[f"cudnn/{remat}"] = (
        f"estimated {need:.3g} GiB > {usable / GiB:.3g} GiB usable"
      )
      continue
    steps.append(
      dict(
        key=f"cudnn/{remat}",
        attention="cudnn",
        remat=remat,
        batch_per_device=plan.batch_per_device,
        estimate_gib=need,
        why=why,
      )
    )
    if i == 0:
      steps.append(
        dict(
          key=f"xla/{first}",
          attention="xla",
          remat=first,
          batch_per_device=xla_batch,
          estimate_gib=gib("xla", first, xla_batch),
          why="XLA attention, at the largest batch its estimate fits",
        )
      )
  return dict(
    steps=steps,
    left_out=left_out,
    usable_gib=usable / GiB if usable else None,
    estimate_error=error,
  )


def plan_lines(planned: dict) -> list[str]:
  """The plan as the check prints it."""
  lines = ["training steps, in order:"]
  for i, step in enumerate(planned["steps"], 1):
    estimate = step["estimate_gib"]
    lines.append(
      f"  {i}. {step['key']} at {step['batch_per_device']} clips "
      f"per device ({step['why']}; estimated "
      + (f"{estimate:.3g} GiB)" if estimate is not None else "memory unknown)")
    )
  for key, why in planned["left_out"].items():
    lines.append(f"  left out: {key} ({why})")
  if planned["estimate_error"]:
    lines.append(f"  no memory estimate: {planned['estimate_error']}")
  return lines


# ------------------------------------------------------------------- attention
def attention_cases(plan: Plan) -> dict[str, tuple[shapes.AttentionShape, int]]:
  """name -> (attention shape, batch) of `ATTENTION_CASES` at the plan's
  sizes: as many tokens per batch as `attention_batch` CLIP vision clips."""
  cases = {}
  for name, (recipe, tower) in ATTENTION_CASES.items():
    cases[name] = shapes.attention_shapes(recipe_config(plan, recipe).model)[
      tower
    ]
  tokens = plan.attention_batch * cases["clip_vision"].tokens
  return {
    name: (shape, max(1, round(tokens / shape.tokens)))
    for name, shape in cases.items()
  }


@functools.cache  # Cases of one shape (dry runs) compile once.
def _attention_fns(implementation: str, causal: bool):
  attend = functools.partial(
    attention.dot_product_attention,
    implementation=implementation,
    is_causal=causal,
  )

  def with_grads(q, k, v, g):
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(g)

  return jax.jit(attend), jax.jit(with_grads)


def _relative_errors(got, want) -> dict[str, float]:
  errors = {}
  for name, a, b in zip(
    ("out", "dq", "dk", "dv"),
    jax.tree.leaves(got),
    jax.tree.leaves(want),
    strict=True,
  ):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    errors[name] = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
  return errors


def check_attention(plan: Plan, save=None) -> dict:
  """cuDNN against XLA at every `ATTENTION_CASES` shape, against float32.

  A cuDNN failure is recorded under the case's 'cudnn' ('error'); XLA is
  measured regardless. 'cudnn_usable': True when every case ran cuDNN
  within tolerance, False when one failed, None in a dry run (no GPU).
  Each measurement's first call (its compile) is timed apart, as
  'compile_ms'. `save(result)` is called after each case: a process that
  dies in the next keeps the cases done.
  """
  dtype = jnp.bfloat16
  result = {"dtype": "bfloat16", "tolerance_rel": REL_TOLERANCE}
  for name, (shape, batch) in attention_cases(plan).items():
    dims = (batch, shape.tokens, shape.heads, shape.head_dim)
    q, k, v, g = (
      jax.random.normal(key, dims, jnp.float32).astype(dtype)
      for key in jax.random.split(jax.random.key(1), 4)
    )
    _, reference = _attention_fns("xla", shape.causal)
    with jax.default_matmul_precision("highest"):
      want = reference(*(x.astype(jnp.float32) for x in (q, k, v, g)))
    entry = {
      "recipe": ATTENTION_CASES[name][0],
      "shape": list(dims),
      "causal": shape.causal,
      "layers": shape.layers,
    }
    for impl in ("xla", "cudnn"):
      entry[impl] = measured = dict.fromkeys(
        (
          "compile_ms",
          "forward_ms",
          "forward_backward_ms",
          "errors",
          "passed",
          "note",
          "error",
        )
      )
      reason = attention.cudnn_unsupported_reason(shape.head_dim, dtype)
      if impl == "cudnn" and reason:
        key = "note" if plan.dry else "error"  # A dry run cannot say.
        measured[key] = f"cuDNN attention cannot run here: {reason}"
        continue
      try:
        forward, with_grads = _attention_fns(impl, shape.causal)
        start = time.perf_counter()  # The first calls compile.
        jax.block_until_ready(forward(q, k, v))
        got = jax.block_until_ready(with_grads(q, k, v, g))
        measured["compile_ms"] = 1e3 * (time.perf_counter() - start)
        measured["errors"] = _relative_errors(got, want)
        measured["passed"] = max(measured["errors"].values()) < REL_TOLERANCE
        measured["forward_ms"] = breakdown.median_ms(
          forward, q, k, v, repeats=plan.repeats
        )
        measured["forward_backward_ms"] = breakdown.median_ms(
          with_grads, q, k, v, g, repeats=plan.repeats
        )
      except Exception as e:
        traceback.print_exc()  # Recorded; the other cases still run.
        measured["error"] = error_text(e)
    both = (
      entry["cudnn"]["forward_backward_ms"],
      entry["xla"]["forward_backward_ms"],
    )
    entry["cudnn_speedup"] = both[1] / both[0] if all(both) else None
    result[name] = entry
    if save:
      save(result)
  cudnn = [result[name]["cudnn"] for name in ATTENTION_CASES]
  errors = [c["error"] for c in cudnn if c["error"]]
  result["cudnn_error"] = errors[0] if errors else None
  result["cudnn_usable"] = (
    False
    if errors or any(c["passed"] is False for c in cudnn)
    else None
    if plan.dry
    else True
  )
  result["passed"] = all(
    result[name][impl]["passed"] is not False
    for name in ATTENTION_CASES
    for impl in ("xla", "cudnn")
  )
  return result


# -------------------------------------------------------------------- training
@dataclasses.dataclass
class Measured:
  """A compiled step and what it ran on, kept for the later sections."""

  config: object
  compiled: object
  state: object
  rest: object
  result: dict


def _cudnn_calls(hlo, lowered, source: str, *, required: bool) -> dict:
  """cuDNN attention calls in a step's HLO (and, to tell XLA's rewrites
  from JAX's choice, in the lowered step); none is an error if `required`."""
  calls = cuda_trace.cudnn_attention_calls(hlo)
  lowered = cuda_trace.cudnn_attention_calls(lowered)
  calls = {
    "forward": calls["forward"],
    "backward": calls["backward"],
    "lowered_forward": lowered["forward"],
    "lowered_backward": lowered["backward"],
    "source": source,
  }
  if required and (not calls["forward"] or not calls["backward"]):
    raise RuntimeError(
      f"no cuDNN attention in the step ({calls}): XLA attention would run"
    )
  return calls


def _lowered_for_cuda(config, mesh, batch) -> jax.stages.Lowered:
  """The dry run's stand-in for compiled GPU HLO: the cuDNN step, lowered."""
  config = config.copy_and_resolve_references()
  config.model.update(attention="cudnn", dtype="bfloat16")
  with cuda_trace.forced_cudnn():
    state, rest, steps = steps_lib.build_state_and_steps(
      config, tasks.get_task(config.task), mesh, abstract=True
    )
    key = jax.eval_shape(lambda: jax.random.key(0))
    return cuda_trace.lower_for_cuda(steps.train, state, rest, batch, key)


def measure_step(
  plan: Plan,
  remat: str,
  deadline=None,
  *,
  attention_impl: str = "cudnn",
  batch_per_device: int | None = None,
) -> Measured:
  """Compiles the recipe's step under `remat` and times it (see docstring).

  With cuDNN attention, the compiled step must call cuDNN (in a dry run,
  the step lowered for CUDA; the CPU then times its XLA stand-in). Out of
  memory, the batch is halved and the step compiled again, unless
  `deadline` (its `left()` seconds) leaves no time for that and for the
  sections after training.
  """
  mesh = sharding.make_mesh()
  per_device, halved = batch_per_device or plan.batch_per_device, []
  cudnn = attention_impl == "cudnn"
  began = time.monotonic()
  while True:
    config = recipe_config(plan, attention_impl=attention_impl, remat=remat)
    config.batch_size = per_device * jax.device_count()
    try:
      calls = None
      if plan.dry and cudnn:  # The CPU step has XLA attention: count CUDA's.
        lowered = _lowered_for_cuda(
          config, mesh, batches.batch_spec(config, config.batch_size)
        )
        calls = _cudnn_calls(
          lowered, lowered, "lowered for CUDA (dry run)", required=True
        )
      task = tasks.get_task(config.task)
      state, rest, steps = steps_lib.build_state_and_steps(config, task, mesh)
      batch = random_batches.random_batch(config, config.batch_size, mesh)
      key = jax.random.key(config.seed)
      start = time.perf_counter()
      lowered = steps.train.lower(state, rest, batch, key)
      lower_s = time.perf_counter() - start
      compiled = lowered.compile()
      compile_s = time.perf_counter() - start - lower_s
      if not plan.dry:
        calls = _cudnn_calls(
          compiled.as_text(), lowered, "compiled HLO", required=cudnn
        )
      # The first run apart: it loads the executable and autotunes.
      start = time.perf_counter()
      state, metrics = compiled(state, rest, batch, key)
      jax.block_until_ready(metrics)
      first_step_s = time.perf_counter() - start
      for _ in range(plan.warmup_steps - 1):
        state, metrics = compiled(state, rest, batch, key)
      jax.block_until_ready(metrics)
      start = time.perf_counter()
      for _ in range(plan.timed_steps):  # Dispatched ahead, as training does.
        state, metrics = compiled(state, rest, batch, key)
      jax.block_until_ready((state, metrics))
      step_s = (time.perf_counter() - start) / plan.timed_steps
      break
    except Exception as e:
      if not _is_oom(e) or per_device == 1:
        raise
      spent = time.monotonic() - began  # About what a retry costs.
      if deadline is not None and deadline.left() < spent + plan.reserve_s:
        raise RuntimeError(
          f"out of memory at {per_device} clips per device, and no time "
          f"left to compile at {per_device // 2}"
        ) from e
      halved.append(per_device)
      per_device //= 2
      log(f"  out of memory at {halved[-1]} clips per device: {per_device}")
  flops = (
    flops_lib.flops_per_example(config.model)["training"] * config.batch_size
  )
  peak = monitor.peak_flops_per_device()
  metrics = monitor.to_python(metrics)
  result = dict(
    attention=attention_impl,
    remat=remat,
    batch_per_device=per_device,
    global_batch=config.batch_size,
    halved_from=halved,
    lower_s=lower_s,
    compile_s=compile_s,
    first_step_s=first_step_s,
    cudnn_calls=calls,
    # XLA's figure as `python -m vidjax.compile` gives it on any machine:
    # the offline figures (BENCHMARKS.md) compared with the GPU's own.
    compiled_gib=memory.compiled_bytes(compiled) / GiB,
    peak_gib=_peak_memory_gib(),
    step_s=step_s,
    clips_per_s=config.batch_size / step_s,
    tflops_per_device=flops / step_s / jax.device_count() / 1e12,
    mfu=(
      monitor.model_flops_utilization(flops, step_s, jax.device_count(), peak)
      if peak
      else None
    ),
    loss=metrics["train/loss"],
  )
  return Measured(config, compiled, state, rest, result)


def check_training(
  plan: Plan, steps_plan: dict, deadline, save
) -> tuple[dict, Measured | None]:
  """`measure_step` for each planned step while time allows; the fastest
  kept. After a cuDNN failure other than out-of-memory, the later cuDNN
  steps are skipped (they would fail alike); XLA's still run."""
  config = recipe_config(plan)
  result = {
    "config": CONFIG_FILE.name + (f":{plan.config_arg}" if plan.dry else ""),
    "variant": config.model.variant,
    "frames": config.model.num_frames,
    "dtype": config.model.dtype,
    "training_gflops_per_clip": flops_lib.flops_per_example(config.model)[
      "training"
    ]
    / 1e9,
    "steps": {},
    "fastest": None,
    "cudnn_error": None,
  }
  fastest, longest = None, 0.0
  for run in steps_plan["steps"]:
    key = run["key"]
    # Time is kept for the breakdown and data sections after this one.
    if result["steps"] and deadline.left() < longest + plan.reserve_s:
      result["steps"][key] = {"skipped": "time limit (--time-limit-s)"}
      continue
    if run["attention"] == "cudnn" and result["cudnn_error"]:
      result["steps"][key] = {"skipped": "cuDNN failed in an earlier step"}
      continue
    elapsed = plan.time_limit_s - deadline.left()
    if (
      run["why"] == "if time remains"
      and plan.optional_until_s is not None
      and elapsed > plan.optional_until_s
    ):
      result["steps"][key] = {
        "skipped": f"optional, and {elapsed:.0f} s into a dry run"
      }
      continue
    log(f"training step {key}, {run['batch_per_device']} clips per device")
    start = time.monotonic()
    try:
      measured = measure_step(
        plan,
        run["remat"],
        deadline,
        attention_impl=run["attention"],
        batch_per_device=run["batch_per_device"],
      )
      result["steps"][key] = measured.result
      log(
        f"  {measured.result['clips_per_s']:.1f} clips/s, MFU "
        f"{measured.result['mfu']}"
      )
      speed = measured.result["clips_per_s"]
      if fastest is None or speed > fastest.result["clips_per_s"]:
        fastest = measured
        result["fastest"] = key
    except Exception as e:
      traceback.print_exc()
      result["steps"][key] = {"error": error_text(e)}
      if run["attention"] == "cudnn" and not _is_oom(e):
        result["cudnn_error"] = error_text(e)
    longest = max(longest, time.monotonic() - start)
    save(result)
  return result, fastest
