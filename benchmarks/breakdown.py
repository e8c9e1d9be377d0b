"""The GPU check's step-time breakdown: matmul, attention, and the rest.

The fastest measured CLIP step (`gpu_measure.check_training`) is split into

  matmul     the towers' linear layers alone at the step's shapes (qkv,
             attention output, MLP in and out; forward and both backward
             products, bf16), times their depth;
  attention  the attention section's forward + backward at the step's tower
             shapes and implementation, scaled to the step's batch;
  rest       the step less both: LayerNorms, activations, residual adds and
             casts, the pad and slice copies around each cuDNN call, the
             loss, the optimizer update, and whatever remat recomputes.

The rest is memory-bound work, so its bytes decide it: XLA's cost analysis
of the compiled step counts the bytes every operation reads and writes
('bytes accessed'); the matmuls' and attention's own operands and results
(the least they move) are taken off, and what remains is divided by the
rest's time: its rate against the device's memory bandwidth says how much a
fusion, a bf16 residual stream (`model.residual_dtype`) or bf16 LayerNorms
(`model.norm_dtype`) can still gain. On a CPU (the dry run) the figures
only show that every field is computed.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from vidjax.models import shapes, spec as spec_lib
from vidjax.report import monitor

# HBM bandwidth per chip (bytes/s), looked up in `device_kind` as
# `monitor.PEAK_FLOPS_BY_DEVICE_KIND` is: longest key first.
HBM_BYTES_PER_S = {
  "h100 pcie": 2.0e12,
  "h100": 3.35e12,
  "h200": 4.8e12,
  "gh200": 4.0e12,
  "b200": 8.0e12,
  "a100-sxm4-80gb": 2.04e12,
  "a100": 1.56e12,
}
BF16 = 2  # Bytes per element.


def hbm_bytes_per_s(device_kind: str | None = None) -> float | None:
  return monitor.by_device_kind(HBM_BYTES_PER_S, device_kind)


def median_ms(fn, *args, repeats: int) -> float:
  """Milliseconds of `fn(*args)` (compiled first), the median of `repeats`."""
  jax.block_until_ready(fn(*args))  # Compiles.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def _linear_layers(model, batch: int) -> list[tuple[str, int, int, int, int]]:
  """(tower, rows, fan in, fan out, depth) of each block's linear layers."""
  spec = spec_lib.from_config(model)
  towers = shapes.attention_shapes(model)
  layers = []
  for tower, stack in (
    ("vision", spec.vision.blocks),
    ("text", spec.text.blocks),
  ):
    rows = batch * towers[tower].tokens
    width, mlp = stack.width, stack.mlp_dim
    for fan_in, fan_out in (
      (width, 3 * width),
      (width, width),
      (width, mlp),
      (mlp, width),
    ):
      layers.append((tower, rows, fan_in, fan_out, towers[tower].layers))
  return layers


def _bytes_accessed(compiled) -> float | None:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older jax: one dict per module.
    analysis = analysis[0] if analysis else {}
  return (analysis or {}).get("bytes accessed")


def check_breakdown(results: dict, measured, repeats: int) -> dict:
  """The module docstring's split of the fastest step.

  Args:
    results: the check's sections so far ('attention' and 'training').
    measured: the fastest step (`gpu_measure.Measured`).
    repeats: timed calls per matmul.
  """
  if measured is None:
    raise RuntimeError("needs a measured training step")
  step, model = measured.result, measured.config.model
  batch = step["batch_per_device"]
  products = jax.jit(lambda x, w, dy: (x @ w, dy @ w.T, x.T @ dy))
  key = jax.random.key(2)
  matmul_ms = flops = matmul_bytes = 0.0
  layers = []
  for tower, rows, fan_in, fan_out, depth in _linear_layers(model, batch):
    x = jax.random.normal(key, (rows, fan_in), jnp.bfloat16)
    w = jax.random.normal(key, (fan_in, fan_out), jnp.bfloat16)
    dy = jax.random.normal(key, (rows, fan_out), jnp.bfloat16)
    ms = median_ms(products, x, w, dy, repeats=repeats)
    matmul_ms += depth * ms
    flops += depth * 3 * 2 * rows * fan_in * fan_out
    # Each product reads two of x, w, dy and writes the third's shape.
    matmul_bytes += (
      depth * 3 * BF16 * (rows * fan_in + fan_in * fan_out + rows * fan_out)
    )
    layers.append(
      {
        "tower": tower,
        "m": rows,
        "k": fan_in,
        "n": fan_out,
        "depth": depth,
        "ms_forward_backward": ms,
      }
    )
  # What the compiled step ran: in a dry run XLA stands in for cuDNN.
  att, impl = results.get("attention", {}), model.attention
  attention_ms = attention_bytes = 0.0
  for tower, case in (("vision", "clip_vision"), ("text", "clip_text")):
    shape = shapes.attention_shapes(model)[tower]
    measured_ms = att.get(case, {}).get(impl, {}).get("forward_backward_ms")
    if measured_ms is None:
      attention_ms = None
      break
    scale = batch / att[case]["shape"][0]
    attention_ms += scale * measured_ms * shape.layers
    # Forward: q, k, v in, out; backward: those and d_out in, dq, dk, dv.
    width = shape.heads * shape.head_dim
    attention_bytes += 12 * BF16 * batch * shape.tokens * width * shape.layers
  step_ms = 1e3 * step["step_s"]
  other_ms = step_ms - matmul_ms - (attention_ms or 0.0)
  step_bytes = _bytes_accessed(measured.compiled)  # Per device.
  other_bytes = (
    step_bytes - matmul_bytes - attention_bytes if step_bytes else None
  )
  rate = (
    other_bytes / (other_ms / 1e3) if other_bytes and other_ms > 0 else None
  )
  peak = hbm_bytes_per_s()
  return dict(
    step=f"{step['attention']}/{step['remat']}",
    batch_per_device=batch,
    layers=layers,
    step_ms=step_ms,
    matmul_ms=matmul_ms,
    matmul_tflops=flops / matmul_ms / 1e9,
    attention_ms=attention_ms,
    attention_implementation=impl,
    other_ms=other_ms,
    other_fraction=other_ms / step_ms,
    step_gb=step_bytes / 1e9 if step_bytes else None,
    matmul_gb=matmul_bytes / 1e9,
    attention_gb=attention_bytes / 1e9,
    other_gb=other_bytes / 1e9 if other_bytes else None,
    other_gb_per_s=rate / 1e9 if rate else None,
    hbm_gb_per_s=peak / 1e9 if peak else None,
    other_of_hbm=rate / peak if rate and peak else None,
  )


def breakdown_line(section: dict) -> str:
  """One line: where the step's time goes, and what the rest moves."""
  step = section["step_ms"]

  def part(name, ms):
    return (
      f"{name} {ms:.1f} ms ({ms / step:.0%})"
      if ms is not None
      else f"{name} unknown"
    )

  line = f"step {section['step']} {step:.1f} ms: " + ", ".join(
    [
      part("matmul", section["matmul_ms"]),
      part("attention", section["attention_ms"]),
      part("rest", section["other_ms"]),
    ]
  )
  if section["other_gb"] is not None:
    line += f"; the rest moves {section['other_gb']:.1f} GB"
    if section["other_gb_per_s"]:
      line += f" at {section['other_gb_per_s']:.0f} GB/s"
    if section["other_of_hbm"]:
      line += f" ({section['other_of_hbm']:.0%} of HBM bandwidth)"
  return line
