r"""One-shot GPU check: environment, cuDNN attention, training step, data rate.

    launch/gpu_check.sh [--dry] [--out gpu_check.json] [--remat none,full]
    python -m vidjax.bench.gpu_check [--dry] [--out FILE] [--remat LIST]
        [--budget-s S]

Writes ONE JSON file (default gpu_check.json), rewritten after every section
so that a run cut short keeps what it measured, and prints it at the end
(one compact line per section). A section that fails holds {"error": ...}
and the others still run. Sections, in the order they run:

  environment  versions (jax, jaxlib, CUDA plugin, cuDNN wheel, flax, optax,
               grain, av), backend, device kind, count and memory, CPUs, the
               known bf16 peak.
  attention    `vidjax.models.attention.dot_product_attention` with 'xla' and
               'cudnn', bf16, ViT-B/16 4-frame shapes [B=64, T=785, N=12,
               H=64]: output and gradient (dq, dk, dv) errors against float32
               XLA on the same inputs (max abs, relative norm; passed when
               every relative error < 2e-2), cuDNN against XLA, compiled temp
               memory, median ms of forward and forward+backward.
  training     the CLIP ViT-B/16 4-frame contrastive step of
               configs/clip_vitb16_ego4d.py (bf16, attention 'auto'), built
               by `vidjax.train.setup` exactly as training builds it, on a
               device-resident random uint8 batch. Per remat policy ('none',
               'full', 'dots_saveable'; a policy starts only if the time
               budget allows): the largest per-device batch, doubling from 64
               up to 1024, whose compiled step fits 95% of the allocator's
               limit (`BatchSearch`: sizes predicted from `memory_analysis()`,
               each compiled before it is accepted; a step that runs out of
               memory anyway is halved), then clips/s over 5 timed steps
               after 2 warm-up ones, TFLOP/s per device (`vidjax.models.flops`),
               MFU (`vidjax.logging.peak_flops_per_device`), memory, loss.
  data         the real input pipeline (`vidjax.data.pipeline`, Grain, one
               worker process per CPU core) on synthetic H.264 at Ego4D's 288p
               chunked with the chunker's defaults, 4 frames -> 224: clips/s
               after the workers' start-up burst. Skipped, saying why, when
               grain or av cannot be imported.
  data_bound   data clips/s over the fastest step's clips/s, and whether the
               pipeline is the bottleneck (ratio < 1).

`--dry` runs the same code on CPU in about a minute: the config's `:debug`
model (tiny, float32), global batch 8 then 16, XLA attention, one Grain
worker; the cuDNN comparison is reported as skipped with the reason.
tests/test_gpu_check.py runs it.

On the device tool's GPU machine (no network; Python 3.12, jax 0.11 for CUDA
13, flax, optax, orbax, but no ml_collections, grain or av), see
launch/gpu_check.sh's header:

  1. Here, once per checkout (39 MiB of wheels into the git-ignored .whl/):
       launch/gpu_check.sh --wheels
  2. One call, about 6-8 minutes (the script installs .whl/ first):
       run(command="set -o pipefail; bash launch/gpu_check.sh --out "
                   "$OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log",
           carry=[".whl"], timeout_s=540)
     The JSON and the log come back under files_at; the JSON ends output_tail.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.metadata
import json
import math
import os
from pathlib import Path
import statistics
import sys
import tempfile
import time
import traceback
import types

import jax
import jax.numpy as jnp
import numpy as np

from vidjax import config as config_lib, logging as log_lib, sharding
from vidjax.models import attention, flops as flops_lib

GiB = 2**30
REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "clip_vitb16_ego4d.py"
CUDNN_REL_TOL = 2e-2  # bf16 operands land between 1e-3 and 1e-2.
# Of the allocator's limit (launch/gpu_check.sh, like launch/local.sh, gives
# it 90% of the card): XLA's memory analysis leaves out cuDNN workspaces and
# fragmentation, and a step that fails at run time costs a rebuild.
FIT_FRACTION = 0.95
DATA_PACKAGES = ("grain", "av")
VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin",
            "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "flax", "optax",
            "orbax-checkpoint", "numpy", "ml-collections", "grain", "av")


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sizes of one check: the GPU run or the CPU dry run."""
  dry: bool
  attention_shape: tuple[int, int, int, int]  # [B, T, N, H]
  attention_dtype: str
  config_arg: str  # configs/clip_vitb16_ego4d.py:ARG
  first_batch: int  # Per device.
  max_batch: int  # Per device.
  warmup_steps: int = 2
  timed_steps: int = 5
  corpus: dict = dataclasses.field(default_factory=dict)  # make_corpus kwargs
  short_side: int = 288
  data_batch: int = 32  # Per device.
  data_workers: int = -1  # Grain worker processes; -1: one per CPU core.
  data_seconds: float = 30.0


def make_plan(dry: bool) -> Plan:
  """The GPU check's sizes, or the dry run's (global batch 8 then 16)."""
  if dry:
    per_device = max(1, 8 // jax.device_count())
    return Plan(
        dry=True, attention_shape=(2, 4 * 16 + 1, 2, 32),
        attention_dtype="float32", config_arg="debug", first_batch=per_device,
        max_batch=2 * per_device, warmup_steps=1, timed_steps=2,
        corpus=dict(num_videos=4, segment_seconds=2.0, fps=8, height=96, width=128),
        short_side=0, data_batch=per_device, data_workers=1, data_seconds=5.0)
  return Plan(
      dry=False, attention_shape=(64, 4 * 196 + 1, 12, 64),
      attention_dtype="bfloat16", config_arg="", first_batch=64, max_batch=1024,
      corpus=dict(num_videos=12, segment_seconds=4.0, fps=30, height=288, width=512))


def _log(message: str) -> None:
  print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


class _Unavailable(types.ModuleType):
  """Stands in for a package that is not installed; any use raises."""

  def __getattr__(self, attr):
    if attr.startswith("__"):
      raise AttributeError(attr)
    raise ModuleNotFoundError(f"{self.__name__} is not installed here "
                              f"(wanted {self.__name__}.{attr})")


def _missing(names) -> list[str]:
  """The packages among `names` that cannot be imported (placeholders count)."""
  missing = []
  for name in names:
    try:
      module = importlib.import_module(name)
    except ImportError:
      module = None
    if module is None or isinstance(module, _Unavailable):
      missing.append(name)
  return missing


def import_train(missing: list[str]):
  """`vidjax.train`, importable where grain or av are missing.

  train.py imports the data pipeline at module level, but the step built
  here never reads data: a placeholder stands in for each missing package.
  """
  for name in missing:
    if sys.modules.get(name) is None:
      sys.modules[name] = _Unavailable(name)
  return importlib.import_module("vidjax.train")


def _device_memory() -> tuple[float, str]:
  stats = jax.devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return float(stats["bytes_limit"]), "device bytes_limit"
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host RAM"


def _is_oom(error: Exception) -> bool:
  return "RESOURCE_EXHAUSTED" in str(error) or "out of memory" in str(error).lower()


def _median_ms(fn, *args, warmup: int = 2, repeats: int = 10) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


# ----------------------------------------------------------------- environment
def environment() -> dict:
  """Versions, devices, memory and CPUs of this machine."""
  versions = {}
  for dist in VERSIONS:
    try:
      versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      pass
  device = jax.devices()[0]
  memory, source = _device_memory()
  peak = log_lib.peak_flops_per_device()
  return dict(
      python=sys.version.split()[0], versions=versions,
      missing=_missing(DATA_PACKAGES),
      backend=jax.default_backend(), device_kind=device.device_kind,
      device_count=jax.device_count(),
      compute_capability=getattr(device, "compute_capability", None),
      memory_gib=memory / GiB, memory_source=source, cpu_count=os.cpu_count(),
      peak_tflops_per_device=peak / 1e12 if peak else None,
      env={k: os.environ[k] for k in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                      "JAX_PLATFORMS") if k in os.environ})


# ------------------------------------------------------------------- attention
def _attention_grads(implementation: str):
  """jit(q, k, v, g) -> (out, (dq, dk, dv)) of `dot_product_attention`."""
  def run(q, k, v, g):
    out, vjp = jax.vjp(functools.partial(
        attention.dot_product_attention, implementation=implementation), q, k, v)
    return out, vjp(g)
  return jax.jit(run)


def _errors(got, want) -> dict:
  """Max abs and relative-norm differences, per output, in float32."""
  names = ("out", "dq", "dk", "dv")
  flat_got, flat_want = jax.tree.leaves(got), jax.tree.leaves(want)
  out = {}
  for name, a, b in zip(names, flat_got, flat_want, strict=True):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    out[name] = dict(max_abs=float(jnp.max(jnp.abs(a - b))),
                     rel=float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)))
  return out


def _check_implementation(impl: str, reference, q, k, v, g) -> tuple:
  """(outputs, report) of one implementation: errors, memory, time."""
  grads = _attention_grads(impl)
  forward = jax.jit(functools.partial(attention.dot_product_attention,
                                      implementation=impl))
  outputs = grads(q, k, v, g)
  errors = _errors(outputs, reference)
  return outputs, dict(
      vs_reference=errors,
      passed=all(e["rel"] < CUDNN_REL_TOL for e in errors.values()),
      forward_temp_mib=forward.lower(q, k, v).compile()
      .memory_analysis().temp_size_in_bytes / 2**20,
      forward_backward_temp_mib=grads.lower(q, k, v, g).compile()
      .memory_analysis().temp_size_in_bytes / 2**20,
      forward_ms=_median_ms(forward, q, k, v),
      forward_backward_ms=_median_ms(grads, q, k, v, g))


def check_attention(plan: Plan) -> dict:
  """cuDNN vs XLA attention: errors against float32, memory, time."""
  b, t, n, h = plan.attention_shape
  dtype = jnp.dtype(plan.attention_dtype)
  q, k, v, g = (jax.random.normal(key, (b, t, n, h), jnp.float32).astype(dtype)
                for key in jax.random.split(jax.random.key(1), 4))
  with jax.default_matmul_precision("highest"):  # No TF32 in the reference.
    reference = _attention_grads("xla")(*(x.astype(jnp.float32) for x in (q, k, v, g)))
  result = dict(shape=[b, t, n, h], dtype=dtype.name, tolerance_rel=CUDNN_REL_TOL,
                reference="xla on the same inputs upcast to float32, highest precision")
  outputs = {}
  for impl in ("xla", "cudnn"):
    reason = attention.cudnn_unsupported_reason(h, dtype) if impl == "cudnn" else None
    if reason:
      result[impl] = {"skipped": reason}
      continue
    try:
      outputs[impl], result[impl] = _check_implementation(impl, reference, q, k, v, g)
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()  # The other implementation still runs.
      result[impl] = {"error": f"{type(e).__name__}: {e}"[:1500], "passed": False}
  if len(outputs) == 2:
    result["cudnn_vs_xla"] = _errors(outputs["cudnn"], outputs["xla"])
  result["passed"] = all(result[i]["passed"] for i in ("xla", "cudnn")
                         if "skipped" not in result[i])
  return result


# -------------------------------------------------------------------- training
def load_train_config(plan: Plan, remat: str, vocab: str, attention_impl: str = ""):
  """configs/clip_vitb16_ego4d.py (dry: its :debug), set up to be built here."""
  if not CONFIG_FILE.exists():
    raise FileNotFoundError(f"{CONFIG_FILE} is missing: the check trains its model")
  spec = str(CONFIG_FILE) + (f":{plan.config_arg}" if plan.config_arg else "")
  config = config_lib.load_config(spec)
  config.model.remat = remat
  if plan.dry:
    config.data.synthetic.enabled = False  # The step reads no data.
  if plan.dry or attention_impl:
    config.model.attention = attention_impl or "xla"
  config.data.vocab = vocab
  config.batch_size = plan.first_batch * jax.device_count()
  return config


def _memory(compiled) -> dict:
  a = compiled.memory_analysis()
  total = (a.argument_size_in_bytes + a.output_size_in_bytes
           - a.alias_size_in_bytes + a.temp_size_in_bytes)
  return dict(arguments_gib=a.argument_size_in_bytes / GiB,
              outputs_gib=a.output_size_in_bytes / GiB,
              aliased_gib=a.alias_size_in_bytes / GiB,
              temp_gib=a.temp_size_in_bytes / GiB, total_gib=total / GiB)


def _random_batch(config, global_batch: int, mesh) -> dict:
  """Device-resident random uint8 clips and int32 tokens, sharded as training's."""
  data, shard = config.data, sharding.batch_sharding(mesh)

  @functools.partial(jax.jit, out_shardings=shard)
  def make(key):
    k_video, k_text = jax.random.split(key)
    shape = (global_batch, data.num_frames, data.size, data.size, 3)
    return {"video": jax.random.bits(k_video, shape, jnp.uint8),
            "tokens": jax.random.randint(
                k_text, (global_batch, config.model.text.context_length), 1,
                config.model.text.vocab_size, jnp.int32)}
  return make(jax.random.key(global_batch))


class BatchSearch:
  """Finds the largest per-device batch whose compiled step fits `limit`.

  Args:
    compile_fn: per-device batch -> (memory dict with 'total_gib' and
      'temp_gib', payload); may raise RESOURCE_EXHAUSTED.
    limit: bytes the compiled step may take.
  """

  def __init__(self, compile_fn, limit: float):
    self.compile_fn, self.limit = compile_fn, limit
    self.trail: list[dict] = []  # One entry per compile, in order.
    self.fits: dict[int, object] = {}  # Per-device batch -> payload.

  def compile(self, per_device: int, predicted: float | None = None) -> bool:
    entry = dict(batch_per_device=per_device,
                 predicted_gib=None if predicted is None else predicted / GiB)
    start = time.perf_counter()
    try:
      memory, payload = self.compile_fn(per_device)
    except Exception as e:  # pylint: disable=broad-except
      if not _is_oom(e):
        raise
      entry.update(fits=False, reason="RESOURCE_EXHAUSTED while compiling")
    else:
      entry.update(memory, compile_s=time.perf_counter() - start)
      entry["fits"] = memory["total_gib"] * GiB <= self.limit
      if entry["fits"]:
        self.fits[per_device] = payload
    self.trail.append(entry)
    _log(f"  batch {per_device}/device: {entry.get('total_gib', math.nan):.2f} "
         f"GiB of {self.limit / GiB:.1f}, fits={entry['fits']}")
    return entry["fits"]

  def predict(self, per_device: int) -> float:
    """Bytes at `per_device`: the line through the smallest and largest
    fitting compiles (with one, temporaries proportional to the batch)."""
    fitted = sorted((e["batch_per_device"], e["total_gib"] * GiB,
                     e["temp_gib"] * GiB) for e in self.trail if e["fits"])
    (b0, m0, _), (b1, m1, temp1) = fitted[0], fitted[-1]
    per_clip = (m1 - m0) / (b1 - b0) if b1 > b0 else temp1 / b1
    return m1 + per_clip * (per_device - b1)

  def largest(self, first: int, cap: int) -> int:
    """Doubles from `first` (halves if it does not fit), up to `cap`.

    Jumps to the largest doubling `predict` says fits, compiles it, and
    accepts it only if it does; a size that does not fit bounds the search.
    """
    size = first
    while not self.compile(size):
      if size == 1:
        raise RuntimeError(f"not even 1 clip per device fits in "
                           f"{self.limit / GiB:.1f} GiB")
      size //= 2
    while True:
      bound = min([cap + 1] + [e["batch_per_device"] for e in self.trail
                               if not e["fits"]])
      target = size * 2
      if target >= bound or self.predict(target) > self.limit:
        return size
      while target * 2 < bound and self.predict(target * 2) <= self.limit:
        target *= 2
      if self.compile(target, self.predict(target)):
        size = target


def _time_steps(compiled, batch, run, key, plan: Plan) -> tuple[list[float], dict]:
  state, metrics, times = run.state, None, []
  for i in range(plan.warmup_steps + plan.timed_steps):
    start = time.perf_counter()
    state, metrics = compiled(state, run.rest, batch, key)
    jax.block_until_ready((state, metrics))  # One step at a time: honest times.
    if i >= plan.warmup_steps:
      times.append(time.perf_counter() - start)
  run.state = state
  return times, log_lib.to_python(metrics)


def check_policy(plan: Plan, remat: str, workdir: Path, vocab: str,
                 attention_impl: str = "") -> dict:
  """Largest fitting batch and step throughput for one remat policy."""
  train = import_train(_missing(DATA_PACKAGES))
  config = load_train_config(plan, remat, vocab, attention_impl)
  run = train.setup(config, workdir / remat)
  key = jax.random.key(config.seed)

  def compile_step(per_device):
    batch = _random_batch(config, per_device * jax.device_count(), run.mesh)
    compiled = run.steps.train.lower(run.state, run.rest, batch, key).compile()
    return _memory(compiled), (compiled, batch)

  search = BatchSearch(compile_step, FIT_FRACTION * _device_memory()[0])
  per_device = search.largest(plan.first_batch, plan.max_batch)
  while True:
    if per_device not in search.fits and not search.compile(per_device):
      per_device //= 2
      continue
    try:
      times, metrics = _time_steps(*search.fits[per_device], run, key, plan)
      break
    except Exception as e:  # pylint: disable=broad-except
      if not _is_oom(e) or per_device == 1:
        raise
      search.trail.append(dict(batch_per_device=per_device, fits=False,
                               reason="RESOURCE_EXHAUSTED while running"))
      del search.fits[per_device]
      per_device //= 2  # The donated state may be gone: build it again.
      run = train.setup(config, workdir / f"{remat}_{per_device}")
  global_batch = per_device * jax.device_count()
  step_s = statistics.median(times)
  flops = flops_lib.flops_per_example(config.model)["training"] * global_batch
  peak = config.get("peak_tflops", 0.0) * 1e12 or log_lib.peak_flops_per_device()
  stats = jax.devices()[0].memory_stats() or {}
  chosen = [e for e in search.trail if e["batch_per_device"] == per_device
            and e["fits"]][-1]
  keep = ("batch_per_device", "predicted_gib", "total_gib", "fits", "compile_s", "reason")
  return dict(
      remat=remat, batch_per_device=per_device, global_batch=global_batch,
      memory={k: v for k, v in chosen.items()
              if k.endswith("_gib") and k != "predicted_gib"},
      compile_s=chosen["compile_s"],
      search=[{k: e[k] for k in keep if k in e} for e in search.trail],
      step_s_median=step_s, step_s_min=min(times),
      clips_per_s=global_batch / step_s,
      tflops_per_device=flops / step_s / jax.device_count() / 1e12,
      mfu=log_lib.model_flops_utilization(flops, step_s, jax.device_count(), peak)
      if peak else None,
      # The process's peak so far, earlier sections and policies included.
      process_peak_gib=(stats["peak_bytes_in_use"] / GiB
                        if "peak_bytes_in_use" in stats else None),
      loss=metrics["train/loss"], grad_norm=metrics["train/grad_norm"])


def check_training(plan: Plan, remats: list[str], workdir: Path, deadline: float,
                   save=lambda partial: None, cudnn_failed: bool = False) -> dict:
  """`check_policy` for each remat policy while the time budget allows.

  `save(result)` is called after each policy, so a run cut short keeps them.
  With `cudnn_failed` (the attention check raised), the step uses XLA
  attention rather than fail the same way.
  """
  attention_impl = "xla" if cudnn_failed else ""
  import_train(_missing(DATA_PACKAGES))  # Before synthetic, which imports av.
  from vidjax import models  # pylint: disable=import-outside-toplevel
  from vidjax.data import synthetic  # pylint: disable=import-outside-toplevel
  # setup() builds a tokenizer; the step's tokens are random ids anyway.
  vocab = str(synthetic.write_vocab(workdir / "vocab.txt.gz"))
  model = load_train_config(plan, remats[0], vocab, attention_impl).model
  kwargs = models.model_kwargs(model)
  result = dict(config=f"{CONFIG_FILE.name}:{plan.config_arg}".rstrip(":"),
                variant=model.variant, num_frames=model.num_frames,
                image_size=model.image_size, dtype=jnp.dtype(kwargs["dtype"]).name,
                attention=attention.resolve_implementation(
                    model.attention, kwargs["vision_width"] // kwargs["vision_heads"],
                    kwargs["dtype"]),
                attention_note=("cuDNN raised in the attention check: XLA used"
                                if cudnn_failed else ""),
                scan=model.scan, device_fraction=FIT_FRACTION, policies={},
                training_gflops_per_clip=flops_lib.flops_per_example(model)["training"] / 1e9)
  longest = 0.0
  for remat in remats:
    if result["policies"] and time.monotonic() + longest > deadline:
      result["policies"][remat] = {"skipped": "time budget (--budget-s) spent"}
      continue
    _log(f"training step, remat={remat}")
    start = time.monotonic()
    try:
      result["policies"][remat] = policy = check_policy(plan, remat, workdir, vocab,
                                                           attention_impl)
      _log(f"  {policy['global_batch']} clips: {policy['clips_per_s']:.1f} clips/s, "
           f"{policy['tflops_per_device']:.1f} TFLOP/s per device")
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()  # The other policies still run.
      result["policies"][remat] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    longest = max(longest, time.monotonic() - start)
    save(result)
  return result


# ------------------------------------------------------------------------ data
def check_data(plan: Plan, workdir: Path, missing: list[str]) -> dict:
  """Steady-state clips/s of the real pipeline on chunked synthetic H.264."""
  if missing:
    return {"skipped": f"{', '.join(missing)} cannot be imported here; carry "
                       "them as wheels (launch/gpu_check.sh --wheels)"}
  # pylint: disable=import-outside-toplevel
  from vidjax.data import chunk, pipeline, synthetic, tokenizer
  start = time.perf_counter()
  corpus = synthetic.make_corpus(workdir / "corpus", progress=False, **plan.corpus)
  store = workdir / "chunks"
  options = chunk.ChunkOptions(short_side=plan.short_side)  # Chunker defaults.
  summary = chunk.chunk_videos(corpus / "raw", store, options, progress=False)
  if summary["failed"]:
    raise RuntimeError(f"chunking failed: {summary['failed']}")
  corpus_s = time.perf_counter() - start
  vocab = synthetic.write_vocab(workdir / "vocab.txt.gz")
  config = load_train_config(plan, "none", str(vocab))
  workers = plan.data_workers if plan.data_workers >= 0 else os.cpu_count()
  config.data.update(format="jsonl", root=str(store), workers=workers,
                     train_annotations=str(corpus / "train.jsonl"))
  batch = plan.data_batch * jax.device_count()
  pipe = pipeline.make_pipeline(config, sharding.make_mesh(), train=True,
                                batch_size=batch, tokenizer=tokenizer.Tokenizer(vocab))
  # Workers start together and buffer batches: drain that burst before timing.
  warmup = max(3, workers * (config.data.worker_buffer + 1)
               + config.data.device_prefetch)
  start = time.perf_counter()
  jax.block_until_ready(next(pipe)["video"])
  first_s = time.perf_counter() - start
  for _ in range(warmup - 1):
    jax.block_until_ready(next(pipe)["video"])
  warmup_s, start, timed = time.perf_counter() - start, time.perf_counter(), 0
  while timed < 2 * warmup or time.perf_counter() - start < plan.data_seconds / 6:
    jax.block_until_ready(next(pipe)["video"])
    timed += 1
    if time.perf_counter() - start > plan.data_seconds:
      break
  seconds = time.perf_counter() - start
  skipped = pipe.skipped
  pipe.close()
  return dict(workers=workers, threads=config.data.threads, cpu_count=os.cpu_count(),
              batch=batch, frames=config.data.num_frames, size=config.data.size,
              source=f"{plan.corpus['width']}x{plan.corpus['height']} "
                     f"@{plan.corpus['fps']} fps",
              chunks=dataclasses.asdict(options), corpus_s=corpus_s,
              first_batch_s=first_s, warmup_batches=warmup, warmup_s=warmup_s,
              timed_batches=timed, timed_s=seconds,
              clips_per_s=timed * batch / seconds, skipped_reads=skipped)


def data_bound(results: dict) -> dict:
  """Whether the pipeline feeds the fastest measured step."""
  data, training = results.get("data", {}), results.get("training", {})
  steps = {k: v["clips_per_s"] for k, v in training.get("policies", {}).items()
           if "clips_per_s" in v}
  if "clips_per_s" not in data or not steps:
    return {"skipped": "needs both the data and the training results"}
  best = max(steps, key=steps.get)
  return dict(data_clips_per_s=data["clips_per_s"], step_clips_per_s=steps[best],
              step_remat=best, ratio=data["clips_per_s"] / steps[best],
              data_bound=data["clips_per_s"] < steps[best])


# ------------------------------------------------------------------------ main
def _jsonable(value, digits: int | None = None):
  """Plain JSON values; non-finite floats as strings, floats rounded if asked."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v, digits) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v, digits) for v in value]
  if isinstance(value, (np.generic, np.ndarray)):
    value = np.asarray(value).item()
  if isinstance(value, float):
    if not math.isfinite(value):
      return str(value)  # Valid JSON, and never mistaken for a number.
    return float(f"{value:.{digits}g}") if digits else value
  return value


def _save(results: dict, path: Path) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(_jsonable(results), indent=1) + "\n")


def summary(results: dict) -> str:
  """The results as compact JSON, one line per section, 4 significant digits."""
  lines = [f" {json.dumps(k)}: {json.dumps(_jsonable(v, 4), separators=(',', ':'))}"
           for k, v in results.items()]
  return "{\n" + ",\n".join(lines) + "\n}"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m vidjax.bench.gpu_check",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--dry", action="store_true",
                      help="tiny shapes on CPU (< 1 min), no cuDNN")
  parser.add_argument("--out", default="gpu_check.json")
  parser.add_argument("--remat", default=None,
                      help="comma-separated policies (default none,full,dots_saveable; "
                           "dry: none,full)")
  parser.add_argument("--budget-s", type=float, default=None,
                      help="start no further remat policy that would end past this "
                           "(default 360; dry 120)")
  args = parser.parse_args(argv)
  begin = time.monotonic()
  plan = make_plan(args.dry)
  remats = (args.remat or ("none,full" if args.dry else
                           "none,full,dots_saveable")).split(",")
  budget = args.budget_s if args.budget_s is not None else (120.0 if args.dry else 360.0)
  deadline = begin + budget
  out = Path(args.out)
  results = {"mode": "dry" if args.dry else "gpu"}

  def save(name, section):
    results[name] = section
    results.pop("total_s", None)  # Kept last.
    results["total_s"] = time.monotonic() - begin
    _save(results, out)

  with tempfile.TemporaryDirectory(prefix="vidjax_gpu_check_") as tmp:
    work = Path(tmp)
    # Training before data: it matters most, and worker processes are what
    # could hang.
    sections = (
        ("environment", environment),
        ("attention", lambda: check_attention(plan)),
        ("training", lambda: check_training(
            plan, remats, work, deadline, functools.partial(save, "training"),
            cudnn_failed="error" in results["attention"].get("cudnn", {}))),
        ("data", lambda: check_data(plan, work, _missing(DATA_PACKAGES))),
        ("data_bound", lambda: data_bound(results)))
    for name, section in sections:
      _log(f"{name} ...")
      start = time.monotonic()
      try:
        result = section()
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()  # One failing section must not lose the rest.
        result = {"error": f"{type(e).__name__}: {e}"[:1500]}
      result["seconds"] = time.monotonic() - start
      save(name, result)
  print(summary(results), flush=True)
  _log(f"wrote {out} in {results['total_s']:.0f} s")
  return results


if __name__ == "__main__":
  main()
