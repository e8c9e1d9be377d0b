"""Multi-head attention on `jax.nn.dot_product_attention`, cuDNN flash or XLA.

AVION's speed comes largely from FlashAttention. In JAX the same kernel is
cuDNN's fused attention, reached through
`jax.nn.dot_product_attention(..., implementation='cudnn')`. Three traps make
an explicit choice and some care necessary:

* `implementation=None` means XLA even on a GPU, so the default never gives
  flash attention;
* cuDNN only takes bf16/fp16 inputs with a head size that is a multiple of 8
  (at most 128 before Hopper, 256 from Hopper on), on an NVIDIA GPU of compute
  capability 8.0 or newer (`cudnn_unsupported_reason` has every rule);
  anything else raises deep inside JAX;
* in training (under `jax.grad`), JAX 0.10-0.12 reject odd sequence lengths
  on the cuDNN path even without a bias ("Unsupported sequence length Q 785"):
  `bias=None` becomes an empty placeholder that its checks count as a bias,
  and cuDNN needs even lengths with a bias. CLIP's towers have odd lengths
  (1 + 196 x frames vision tokens, 77 text tokens), so on the cuDNN path the
  tokens are padded to a multiple of 8 and the padded keys masked out
  (`key_value_seq_lengths`; causal attention masks them already), and the
  output is sliced back. The padded rows cost < 1% at ViT-B shapes.

`implementation` is therefore one of 'cudnn' (fail early, saying why),
'xla', or 'auto' (cuDNN when the inputs allow it, else XLA, logged once).
"""

from __future__ import annotations

import contextlib
import logging

from flax import nnx
import jax
from jax.ad_checkpoint import checkpoint_name  # not re-exported as jax.*
import jax.numpy as jnp

from vidjax.base import internals
from vidjax.config import defaults

_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
# Sequence lengths are padded to a multiple of this on the cuDNN path.
CUDNN_LENGTH_MULTIPLE = 8
_logged_choices: set[str] = set()
# The GPU decided for while tracing for one this machine lacks (its compute
# capability; `assume_gpu`), else None: the machine's own.
_assumed_capability: tuple[int, int] | None = None


@contextlib.contextmanager
def assume_gpu(compute_capability: tuple[int, int]):
  """Within the block, implementations are chosen as on a CUDA GPU of
  `compute_capability` (`benchmarks.cuda_trace.forced_cudnn`)."""
  global _assumed_capability
  previous, _assumed_capability = _assumed_capability, tuple(compute_capability)
  try:
    yield
  finally:
    _assumed_capability = previous


def _gpu_compute_capability() -> tuple[int, int] | None:
  """The first CUDA device's compute capability, or None without one."""
  if _assumed_capability is not None:
    return _assumed_capability
  if jax.default_backend() != "gpu":
    return None
  device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  if not capability:  # ROCm devices have none; cuDNN is CUDA-only.
    return None
  major, minor = (int(part) for part in str(capability).split(".")[:2])
  return major, minor


def cudnn_version() -> int | None:
  """cuDNN's version as JAX reads it (e.g. 91000 for 9.10), or None."""
  return internals.cudnn_version()


def cudnn_unsupported_reason(head_dim: int, dtype) -> str | None:
  """Why cuDNN flash attention cannot run these inputs, or None if it can.

  The rules are JAX's own checks (its cuDNN fused attention module,
  jax 0.10-0.12) for the inputs vidjax passes (BTNH layout, no bias or
  dropout, padded lengths), plus cuDNN's own floor that JAX leaves to the
  compiler: flash attention kernels exist from compute capability 8.0 on.

  Args:
    head_dim: size of one attention head (H).
    dtype: dtype of the queries, keys and values.

  Returns:
    A sentence naming the first failed requirement, or None.
  """
  capability = _gpu_compute_capability()
  if capability is None:
    return (
      f"the default JAX backend is {jax.default_backend()!r}; cuDNN "
      "attention needs an NVIDIA GPU"
    )
  name = f"{capability[0]}.{capability[1]}"
  if capability < (8, 0):
    return (
      f"the GPU has compute capability {name}; cuDNN flash attention "
      "needs 8.0 (Ampere) or newer"
    )
  version = cudnn_version()
  if version is None:
    return (
      "JAX finds no cuDNN library (install JAX with its CUDA extra, "
      'e.g. pip install "jax[cuda12]")'
    )
  if capability == (10, 3) and version < 91100:
    return (
      f"compute capability 10.3 needs cuDNN 9.11 or newer; JAX finds "
      f"cuDNN {version}"
    )
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in _CUDNN_DTYPES]:
    return (
      f"the compute dtype is {jnp.dtype(dtype).name}; cuDNN attention "
      "needs bfloat16 or float16 (set the model dtype to bfloat16)"
    )
  max_head_dim = 256 if capability >= (9, 0) else 128
  if head_dim % 8 or head_dim > max_head_dim:
    return (
      f"the head size is {head_dim}; cuDNN needs a multiple of 8 up to "
      f"{max_head_dim} on compute capability {name}"
    )
  return None


def resolve_implementation(implementation: str, head_dim: int, dtype) -> str:
  """Maps the configured implementation to 'cudnn' or 'xla'.

  Args:
    implementation: 'auto', 'xla' or 'cudnn'.
    head_dim: size of one attention head.
    dtype: dtype the attention runs in.

  Returns:
    'cudnn' or 'xla'.

  Raises:
    ValueError: for an unknown name, or for 'cudnn' when the device, dtype or
      head size cannot use it.
  """
  if implementation not in defaults.ATTENTION:
    raise ValueError(
      f"attention implementation must be one of "
      f"{defaults.ATTENTION}, got {implementation!r}"
    )
  if implementation == "xla":
    return "xla"
  reason = cudnn_unsupported_reason(head_dim, dtype)
  if implementation == "cudnn":
    if reason:
      raise ValueError(
        f"attention='cudnn' cannot be used: {reason}. "
        "Use attention='auto' to fall back to XLA."
      )
    return "cudnn"
  choice = "xla" if reason else "cudnn"
  message = (
    f"attention='auto' chose {choice} for head size {head_dim}, "
    f"dtype {jnp.dtype(dtype).name}"
  )
  if reason:
    message += f" ({reason})"
  if message not in _logged_choices:  # once per distinct choice, not per layer
    _logged_choices.add(message)
    logging.info(message)
  return choice


def dot_product_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  *,
  implementation: str = "auto",
  is_causal: bool = False,
) -> jax.Array:
  """softmax(Q K^T / sqrt(H)) V with the chosen kernel.

  Args:
    query: [B, T, N, H] queries (T tokens, N heads of size H).
    key: [B, S, N, H] keys.
    value: [B, S, N, H] values.
    implementation: 'auto', 'xla' or 'cudnn' (see the module docstring).
    is_causal: token t attends to tokens <= t only (the text tower).

  Returns:
    [B, T, N, H] attention output, in the dtype of `query`.
  """
  chosen = resolve_implementation(implementation, query.shape[-1], query.dtype)
  if chosen == "xla":
    out = jax.nn.dot_product_attention(
      query, key, value, is_causal=is_causal, implementation="xla"
    )
    # Named so that a remat policy can keep it (transformer.REMAT_POLICIES); cuDNN's
    # output is kept through its kernel instead, with its statistics.
    return checkpoint_name(out, "attention")
  return _cudnn_attention(query, key, value, is_causal=is_causal)


def _cudnn_attention(
  query: jax.Array, key: jax.Array, value: jax.Array, *, is_causal: bool
) -> jax.Array:
  """cuDNN flash attention with T and S padded to `CUDNN_LENGTH_MULTIPLE`.

  Padded keys are masked by `key_value_seq_lengths` (for causal attention the
  causal mask already hides them from every real query); padded query rows
  are computed and dropped, so they receive no gradient.
  """
  length, kv_length = query.shape[1], key.shape[1]
  if is_causal and length != kv_length:
    raise ValueError(
      f"causal attention needs as many queries ({length}) as keys ({kv_length})"
    )

  def pad(x):
    extra = -x.shape[1] % CUDNN_LENGTH_MULTIPLE
    return jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0))) if extra else x

  kv_lengths = None
  if kv_length % CUDNN_LENGTH_MULTIPLE and not is_causal:
    kv_lengths = jnp.full((query.shape[0],), kv_length, jnp.int32)
  out = jax.nn.dot_product_attention(
    pad(query),
    pad(key),
    pad(value),
    is_causal=is_causal,
    key_value_seq_lengths=kv_lengths,
    implementation="cudnn",
  )
  return out[:, :length]


class MultiHeadAttention(nnx.Module):
  """Self-attention with one fused QKV projection, as in CLIP and VideoMAE.

  Parameters: `qkv` (kernel [D, 3D], laid out as [q | k | v], each split into
  heads in order) and `out` (kernel [D, D]).
  """

  def __init__(
    self,
    width: int,
    heads: int,
    *,
    qkv_bias: bool = True,
    implementation: str = "auto",
    dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    if width % heads:
      raise ValueError(
        f"attention width {width} is not divisible by {heads} heads"
      )
    self.heads = heads
    self.implementation = implementation
    init = nnx.initializers.xavier_uniform()
    self.qkv = nnx.Linear(
      width,
      3 * width,
      use_bias=qkv_bias,
      dtype=dtype,
      kernel_init=init,
      rngs=rngs,
    )
    self.out = nnx.Linear(
      width, width, dtype=dtype, kernel_init=init, rngs=rngs
    )

  def __call__(self, x: jax.Array, *, is_causal: bool = False) -> jax.Array:
    """Attends over the tokens of `x`.

    Args:
      x: [B, L, D] tokens.
      is_causal: causal masking (text tower).

    Returns:
      [B, L, D].
    """
    batch, length, width = x.shape
    qkv = self.qkv(x).reshape(batch, length, 3, self.heads, -1)
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    attended = dot_product_attention(
      query, key, value, is_causal=is_causal, implementation=self.implementation
    )
    return self.out(attended.reshape(batch, length, width))
