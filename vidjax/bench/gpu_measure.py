"""The GPU check's device measurements: attention, training step, matmuls.

Each `check_*` returns one section of `vidjax.bench.gpu_check`'s JSON (its
docstring says what each measures); `Plan` holds the sizes, on a GPU or in
the CPU dry run.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
import statistics
import time
import traceback

import jax
import jax.numpy as jnp

from vidjax import config as config_lib, models, monitor, sharding
from vidjax import steps as steps_lib, tasks
from vidjax.bench import cuda_trace
from vidjax.data import batches
from vidjax.models import attention, flops as flops_lib

GiB = 2**30
CONFIG_FILE = (Path(__file__).resolve().parents[2] / "configs"
               / "clip_vitb16_ego4d.py")
REL_TOLERANCE = 2e-2  # bf16 attention against float32: 1e-3 to 1e-2.


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sizes of one check: on a GPU, or the CPU dry run."""
  dry: bool
  config_arg: str  # configs/clip_vitb16_ego4d.py[:arg]
  batch_per_device: int
  attention_batch: int
  warmup_steps: int
  timed_steps: int
  data_steps: int
  data_workers: int
  time_limit_s: float  # For the whole check.
  repeats: int = 10  # Timed calls per attention or matmul measurement.
  reserve_s: float = 90.0  # Kept for the sections after training.


def make_plan(dry: bool, time_limit_s: float | None = None) -> Plan:
  """The sizes of the GPU check, or of its dry run on CPU.

  The default time limits (330 s; dry 110 s) fit in a short job slot with
  start-up; what does not fit is skipped or cut short, and the results say
  so.
  """
  if dry:
    return Plan(dry=True, config_arg="debug", batch_per_device=2,
                attention_batch=2, warmup_steps=1, timed_steps=2,
                data_steps=4, data_workers=0,
                time_limit_s=time_limit_s or 110.0, repeats=2, reserve_s=20.0)
  return Plan(dry=False, config_arg="", batch_per_device=256,
              attention_batch=64, warmup_steps=2, timed_steps=10,
              data_steps=30, data_workers=os.cpu_count() or 1,
              time_limit_s=time_limit_s or 330.0)


def recipe_config(plan: Plan, **model):
  """configs/clip_vitb16_ego4d.py (:debug when dry), bf16 on a GPU."""
  spec = str(CONFIG_FILE) + (f":{plan.config_arg}" if plan.config_arg else "")
  config = config_lib.load_config(spec)
  config.model.update(dtype="float32" if plan.dry else "bfloat16",
                      attention="xla" if plan.dry else "cudnn", **model)
  config.data.synthetic.enabled = False  # :debug's; batches come from here.
  config.batch_size = plan.batch_per_device * jax.device_count()
  return config


def log(message: str) -> None:
  print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _is_oom(error: BaseException) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _median_ms(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # Compiles.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def _peak_memory_gib() -> float | None:
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return peak / GiB if peak else None


# ------------------------------------------------------------------- attention
def attention_shapes(model) -> dict[str, tuple[int, int, int, bool]]:
  """name -> (tokens, heads, head size, causal) of the model's two towers."""
  kw = models.model_kwargs(model)
  grid = ((kw["num_frames"] // kw["tubelet"])
          * (kw["image_size"] // kw["patch_size"])**2)
  return {"vision": (1 + grid, kw["vision_heads"],
                     kw["vision_width"] // kw["vision_heads"], False),
          "text": (kw["context_length"], kw["text_heads"],
                   kw["text_width"] // kw["text_heads"], True)}


def _attention_fns(implementation: str, causal: bool):
  attend = functools.partial(attention.dot_product_attention,
                             implementation=implementation, is_causal=causal)

  def with_grads(q, k, v, g):
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(g)
  return jax.jit(attend), jax.jit(with_grads)


def _relative_errors(got, want) -> dict[str, float]:
  errors = {}
  for name, a, b in zip(("out", "dq", "dk", "dv"), jax.tree.leaves(got),
                        jax.tree.leaves(want), strict=True):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    errors[name] = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
  return errors


def check_attention(plan: Plan) -> dict:
  """cuDNN against XLA at the recipe's tower shapes, against float32."""
  model = recipe_config(plan).model
  dtype = jnp.bfloat16
  result = {"batch": plan.attention_batch, "dtype": "bfloat16",
            "tolerance_rel": REL_TOLERANCE}
  shapes = attention_shapes(model)
  for _, heads, size, _ in shapes.values():
    reason = attention.cudnn_unsupported_reason(size, dtype)
    if reason and not plan.dry:  # What this check is for: say it at once.
      raise RuntimeError(f"cuDNN attention cannot run here: {reason}")
  for tower, (tokens, heads, size, causal) in shapes.items():
    shape = (plan.attention_batch, tokens, heads, size)
    q, k, v, g = (jax.random.normal(key, shape, jnp.float32).astype(dtype)
                  for key in jax.random.split(jax.random.key(1), 4))
    _, reference = _attention_fns("xla", causal)
    with jax.default_matmul_precision("highest"):
      want = reference(*(x.astype(jnp.float32) for x in (q, k, v, g)))
    entry = {"shape": list(shape), "causal": causal}
    for impl in ("xla", "cudnn"):
      entry[impl] = measured = dict.fromkeys(
          ("forward_ms", "forward_backward_ms", "errors", "passed", "note"))
      reason = attention.cudnn_unsupported_reason(size, dtype)
      if impl == "cudnn" and reason:  # Dry run.
        measured["note"] = f"not measured: {reason}"
        continue
      forward, with_grads = _attention_fns(impl, causal)
      measured["errors"] = _relative_errors(with_grads(q, k, v, g), want)
      measured["passed"] = max(measured["errors"].values()) < REL_TOLERANCE
      measured["forward_ms"] = _median_ms(forward, q, k, v,
                                          repeats=plan.repeats)
      measured["forward_backward_ms"] = _median_ms(with_grads, q, k, v, g,
                                                   repeats=plan.repeats)
    both = entry["cudnn"]["forward_backward_ms"], entry["xla"]["forward_backward_ms"]
    entry["cudnn_speedup"] = both[1] / both[0] if both[0] else None
    result[tower] = entry
  result["passed"] = all(result[t][i]["passed"] is not False
                         for t in ("vision", "text") for i in ("xla", "cudnn"))
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


def _cudnn_calls(hlo, lowered, source: str) -> dict:
  """cuDNN attention calls in a step's HLO (and, to tell XLA's rewrites
  from JAX's choice, in the lowered step); none is an error."""
  calls = cuda_trace.cudnn_attention_calls(hlo)
  lowered = cuda_trace.cudnn_attention_calls(lowered)
  calls = {"forward": calls["forward"], "backward": calls["backward"],
           "lowered_forward": lowered["forward"],
           "lowered_backward": lowered["backward"], "source": source}
  if not calls["forward"] or not calls["backward"]:
    raise RuntimeError(f"no cuDNN attention in the step ({calls}): XLA "
                       "attention would run")
  return calls


def _lowered_for_cuda(config, mesh, batch) -> jax.stages.Lowered:
  """The dry run's stand-in for compiled GPU HLO: the cuDNN step, lowered."""
  config = config.copy_and_resolve_references()
  config.model.update(attention="cudnn", dtype="bfloat16")
  with cuda_trace.forced_cudnn():
    state, rest, steps = steps_lib.build_state_and_steps(
        config, tasks.get_task(config.task), mesh, abstract=True)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return cuda_trace.lower_for_cuda(steps.train, state, rest, batch, key)


def measure_step(plan: Plan, remat: str, deadline=None) -> Measured:
  """Compiles the recipe's step under `remat` and times it (see docstring).

  Out of memory, the batch is halved and the step compiled again, unless
  `deadline` (its `left()` seconds) leaves no time for that and for the
  sections after training.
  """
  mesh = sharding.make_mesh()
  per_device, halved = plan.batch_per_device, []
  began = time.monotonic()
  while True:
    config = recipe_config(plan, remat=remat)
    config.batch_size = per_device * jax.device_count()
    try:
      if plan.dry:  # The CPU step has XLA attention: count in CUDA's.
        lowered = _lowered_for_cuda(
            config, mesh, batches.batch_spec(config, config.batch_size))
        calls = _cudnn_calls(lowered, lowered, "lowered for CUDA (dry run)")
      task = tasks.get_task(config.task)
      state, rest, steps = steps_lib.build_state_and_steps(config, task, mesh)
      batch = batches.random_batch(config, config.batch_size, mesh)
      key = jax.random.key(config.seed)
      start = time.perf_counter()
      lowered = steps.train.lower(state, rest, batch, key)
      compiled = lowered.compile()
      compile_s = time.perf_counter() - start
      if not plan.dry:
        calls = _cudnn_calls(compiled.as_text(), lowered, "compiled HLO")
      for _ in range(plan.warmup_steps):
        state, metrics = compiled(state, rest, batch, key)
      jax.block_until_ready(metrics)
      start = time.perf_counter()
      for _ in range(plan.timed_steps):  # Dispatched ahead, as training does.
        state, metrics = compiled(state, rest, batch, key)
      jax.block_until_ready((state, metrics))
      step_s = (time.perf_counter() - start) / plan.timed_steps
      break
    except Exception as e:  # pylint: disable=broad-except
      if not _is_oom(e) or per_device == 1:
        raise
      spent = time.monotonic() - began  # About what a retry costs.
      if deadline is not None and deadline.left() < spent + plan.reserve_s:
        raise RuntimeError(
            f"out of memory at {per_device} clips per device, and no time "
            f"left to compile at {per_device // 2}") from e
      halved.append(per_device)
      per_device //= 2
      log(f"  out of memory at {halved[-1]} clips per device: {per_device}")
  memory = compiled.memory_analysis()
  flops = flops_lib.flops_per_example(config.model)["training"] * config.batch_size
  peak = monitor.peak_flops_per_device()
  metrics = monitor.to_python(metrics)
  result = dict(
      remat=remat, batch_per_device=per_device, global_batch=config.batch_size,
      halved_from=halved, compile_s=compile_s, cudnn_calls=calls,
      compiled_gib=(memory.argument_size_in_bytes + memory.output_size_in_bytes
                    - memory.alias_size_in_bytes + memory.temp_size_in_bytes) / GiB,
      peak_gib=_peak_memory_gib(), step_s=step_s,
      clips_per_s=config.batch_size / step_s,
      tflops_per_device=flops / step_s / jax.device_count() / 1e12,
      mfu=(monitor.model_flops_utilization(flops, step_s, jax.device_count(), peak)
           if peak else None),
      loss=metrics["train/loss"])
  return Measured(config, compiled, state, rest, result)


def check_training(plan: Plan, remats: list[str], deadline,
                   save) -> tuple[dict, Measured | None]:
  """`measure_step` per policy while time allows; the fastest kept."""
  config = recipe_config(plan)
  result = {"config": CONFIG_FILE.name + (f":{plan.config_arg}" if plan.dry else ""),
            "variant": config.model.variant, "frames": config.model.num_frames,
            "attention": config.model.attention, "dtype": config.model.dtype,
            "training_gflops_per_clip":
                flops_lib.flops_per_example(config.model)["training"] / 1e9,
            "policies": {}, "fastest": None}
  fastest, longest = None, 0.0
  for remat in remats:
    # Time is kept for the matmul and data sections after this one.
    if result["policies"] and deadline.left() < longest + plan.reserve_s:
      result["policies"][remat] = {"skipped": "time limit (--time-limit-s)"}
      continue
    log(f"training step, remat={remat}")
    start = time.monotonic()
    try:
      measured = measure_step(plan, remat, deadline)
      result["policies"][remat] = measured.result
      log(f"  {measured.result['clips_per_s']:.1f} clips/s, MFU "
           f"{measured.result['mfu']}")
      speed = measured.result["clips_per_s"]
      if fastest is None or speed > fastest.result["clips_per_s"]:
        fastest = measured
        result["fastest"] = remat
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      result["policies"][remat] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    longest = max(longest, time.monotonic() - start)
    save(result)
  return result, fastest


# ------------------------------------------------------------------------ gemm
def check_gemm(plan: Plan, results: dict) -> dict:
  """Matmul time of the step's blocks, and the fastest step split by it."""
  training = results.get("training", {})
  remat = training.get("fastest")
  if not remat:
    raise RuntimeError("needs a measured training step")
  step = training["policies"][remat]
  config = recipe_config(plan)
  kw = models.model_kwargs(config.model)
  batch = step["batch_per_device"]
  towers = {name: (batch * tokens, width, depth) for name, (tokens, width, depth)
            in {"vision": (attention_shapes(config.model)["vision"][0],
                           kw["vision_width"], kw["vision_depth"]),
                "text": (kw["context_length"], kw["text_width"],
                         kw["text_depth"])}.items()}
  # A linear layer's three products: forward, input and weight gradients.
  products = jax.jit(lambda x, w, dy: (x @ w, dy @ w.T, x.T @ dy))
  matmul_ms, flops, shapes = 0.0, 0.0, []
  key = jax.random.key(2)
  for name, (rows, width, depth) in towers.items():
    # qkv, attention output, MLP in, MLP out.
    for fan_in, fan_out in ((width, 3 * width), (width, width),
                            (width, 4 * width), (4 * width, width)):
      x = jax.random.normal(key, (rows, fan_in), jnp.bfloat16)
      w = jax.random.normal(key, (fan_in, fan_out), jnp.bfloat16)
      dy = jax.random.normal(key, (rows, fan_out), jnp.bfloat16)
      ms = _median_ms(products, x, w, dy, repeats=plan.repeats)
      matmul_ms += depth * ms
      flops += depth * 3 * 2 * rows * fan_in * fan_out
      shapes.append({"tower": name, "m": rows, "k": fan_in, "n": fan_out,
                     "ms_forward_backward": ms})
  scale = batch / plan.attention_batch
  att = results.get("attention", {})
  impl = "cudnn" if att.get("vision", {}).get("cudnn", {}).get(
      "forward_backward_ms") else "xla"
  attention_ms = sum(
      scale * att[t][impl]["forward_backward_ms"] * kw[f"{t}_depth"]
      for t in ("vision", "text")) if "vision" in att else None
  step_ms = 1e3 * step["step_s"]
  other_ms = step_ms - matmul_ms - (attention_ms or 0.0)
  return dict(step_remat=remat, batch_per_device=batch, shapes=shapes,
              matmul_ms=matmul_ms, matmul_tflops=flops / matmul_ms / 1e9,
              attention_ms=attention_ms, attention_implementation=impl,
              step_ms=step_ms, other_ms=other_ms,
              other_fraction=other_ms / step_ms)
