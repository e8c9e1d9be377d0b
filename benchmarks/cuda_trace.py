"""GPU code paths on any machine: cuDNN forced, lowered for CUDA, counted.

JAX can lower a function for a platform it does not run on
(`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`). Its cuDNN
attention asks the (absent) GPU for its cuDNN version and compute capability
while tracing, and vidjax asks for the compute capability to choose an
implementation; `forced_cudnn()` answers those questions as an H100/H200 with
cuDNN 9.10 would, so the cuDNN code path is traced exactly as on that GPU and
every shape rule JAX applies there is checked. The tests use it to prove the
GPU path on CPU, `benchmarks.memory` to size what the backward pass keeps
under cuDNN, and `benchmarks.gpu_check` counts the cuDNN calls of the
step it compiled with `cudnn_attention_calls` (in its CPU dry run, of the
step `lower_for_cuda` lowered).
"""

from __future__ import annotations

import collections
import contextlib

import jax

from vidjax.base import internals
from vidjax.models import attention


@contextlib.contextmanager
def forced_cudnn(compute_capability=(9, 0), cudnn_version=91000):
  """Within the block, tracing takes the cuDNN attention path as on a GPU."""
  with (
    attention.assume_gpu(compute_capability),
    internals.cudnn_checks_answered(compute_capability, cudnn_version),
  ):
    yield


def lower_for_cuda(fn, *args, **jit_kwargs) -> jax.stages.Lowered:
  """`fn` traced for `args` and lowered for CUDA.

  `fn` is jitted with `jit_kwargs` first, unless it already is (e.g. a
  run's train step, with its shardings).
  """
  jitted = fn if hasattr(fn, "trace") else jax.jit(fn, **jit_kwargs)
  return jitted.trace(*args).lower(lowering_platforms=("cuda",))


def cudnn_attention_calls(hlo) -> collections.Counter:
  """cuDNN fused-attention calls in a lowered or compiled step, by name.

  On one device they are `__cudnn$fmha*` custom calls. On a mesh of several
  devices JAX wraps each in custom partitioning: the lowered step holds a
  `CustomSPMDPartitioning` call naming a callback, which XLA's partitioner
  replaces with the cuDNN call at compile time; those count under the name
  of the callback's partition function.

  Args:
    hlo: a `jax.stages.Lowered` (alive while its callbacks are looked up:
      JAX keeps them only as long as the lowering), or HLO text.

  Returns:
    Counts by call name, plus 'forward' and 'backward' totals.
  """
  hlo_text = hlo if isinstance(hlo, str) else hlo.as_text()
  counts = internals.cudnn_attention_calls(hlo_text)
  for name, count in list(counts.items()):
    backward = "Backward" in name or "bwd" in name
    counts["backward" if backward else "forward"] += count
  return counts
