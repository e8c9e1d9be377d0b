"""Tracing GPU-only code on a CPU machine: lower for CUDA with cuDNN forced.

JAX can lower a function for a platform it does not run on
(`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`). Its cuDNN
attention asks the (absent) GPU for its cuDNN version and compute capability
while tracing, and vidjax asks for the compute capability to choose an
implementation; `forced_cudnn()` answers those questions as an H100/H200 with
cuDNN 9.10 would, so the cuDNN code path is traced exactly as on that GPU and
every shape rule JAX applies there is checked here.
"""
from __future__ import annotations

import contextlib
import re
from unittest import mock

import jax

from vidjax.models import attention


@contextlib.contextmanager
def forced_cudnn(compute_capability=(9, 0), cudnn_version=91000):
  """Within the block, tracing takes the cuDNN attention path as on a GPU."""
  from jax._src.cudnn import fused_attention_stablehlo as fused
  target = '.'.join(map(str, compute_capability))
  at_least = lambda c: tuple(map(int, c.split('.'))) <= compute_capability
  with contextlib.ExitStack() as stack:
    stack.enter_context(mock.patch.object(
        attention, '_gpu_compute_capability', lambda: compute_capability))
    stack.enter_context(mock.patch.object(
        fused, 'check_cudnn_version', lambda: cudnn_version))
    stack.enter_context(mock.patch.object(
        fused, 'check_compute_capability', at_least))
    stack.enter_context(mock.patch.object(
        fused, 'is_cuda_compute_capability_equal', lambda c: c == target))
    yield


def lower_for_cuda(fn, *args, **jit_kwargs) -> str:
  """StableHLO text of `jax.jit(fn, **jit_kwargs)` lowered for CUDA."""
  traced = jax.jit(fn, **jit_kwargs).trace(*args)
  return traced.lower(lowering_platforms=('cuda',)).as_text()


def cudnn_attention_calls(hlo_text: str) -> dict[str, int]:
  """Counts of cuDNN fused-attention custom calls by name in lowered text."""
  counts: dict[str, int] = {}
  for name in re.findall(r'__cudnn\$fmha\w*', hlo_text):
    counts[name] = counts.get(name, 0) + 1
  return counts
