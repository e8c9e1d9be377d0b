"""Attention: every implementation computes softmax(Q K^T / sqrt(d)) V."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.cuda_trace import (
  cudnn_attention_calls,
  forced_cudnn,
  lower_for_cuda,
)
from vidjax.models import attention


def reference_attention(q, k, v, is_causal=False):
  """Plain softmax(Q K^T / sqrt(d)) V over [B, T, N, H]."""
  logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
  if is_causal:
    t, s = logits.shape[-2:]
    logits = jnp.where(jnp.tril(jnp.ones((t, s), bool)), logits, -jnp.inf)
  return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1), v)


def _qkv(dtype=jnp.float32, shape=(2, 13, 3, 16)):
  keys = jax.random.split(jax.random.key(0), 3)
  return [jax.random.normal(key, shape, dtype) for key in keys]


@pytest.mark.parametrize("implementation", ["xla", "auto"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_values_and_gradients_match_reference(implementation, is_causal):
  q, k, v = _qkv()

  def loss(fn, q, k, v):
    return jnp.sum(jnp.sin(fn(q, k, v)))

  ours = lambda q, k, v: attention.dot_product_attention(
    q, k, v, implementation=implementation, is_causal=is_causal
  )
  ref = lambda q, k, v: reference_attention(q, k, v, is_causal)
  np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), atol=1e-5)
  grads = jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2))(q, k, v)
  ref_grads = jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2))(q, k, v)
  for g, rg in zip(grads, ref_grads):
    np.testing.assert_allclose(g, rg, atol=1e-5)


def test_cudnn_on_cpu_raises_a_clear_error():
  q, k, v = _qkv(jnp.bfloat16)
  with pytest.raises(ValueError, match="attention='cudnn'.*NVIDIA GPU"):
    attention.dot_product_attention(q, k, v, implementation="cudnn")


def test_auto_on_cpu_chooses_xla_and_unknown_names_fail():
  assert attention.resolve_implementation("auto", 64, jnp.bfloat16) == "xla"
  with pytest.raises(ValueError, match="flash"):
    attention.resolve_implementation("flash", 64, jnp.bfloat16)


def test_auto_follows_jax_cudnn_rules_and_logs_its_choice(caplog):
  """`cudnn_unsupported_reason` accepts exactly what JAX's cuDNN path takes.

  JAX's own checks run while tracing the cuDNN training path, as on GPUs of
  each compute capability with an older and a newer cuDNN.
  """

  def jax_accepts(head_dim, dtype):
    q = jax.ShapeDtypeStruct((2, 16, 2, head_dim), dtype)
    loss = lambda q: jnp.sum(
      jax.nn.dot_product_attention(q, q, q, implementation="cudnn").astype(
        jnp.float32
      )
    )
    try:
      jax.eval_shape(jax.grad(loss), q)
    except (NotImplementedError, ValueError):
      return False
    return True

  cases = [
    (capability, version, head_dim, dtype)
    for capability in [(8, 0), (8, 9), (9, 0), (10, 3)]
    for version in [90800, 91100]
    for head_dim in [40, 60, 128, 136, 256, 264]
    for dtype in [jnp.bfloat16, jnp.float16, jnp.float32]
  ]
  for capability, version, head_dim, dtype in cases:
    with forced_cudnn(capability, version):
      ours = attention.cudnn_unsupported_reason(head_dim, dtype)
      assert (ours is None) == jax_accepts(head_dim, dtype), (
        capability,
        version,
        head_dim,
        dtype,
        ours,
      )

  with forced_cudnn((7, 5)):  # cuDNN's floor, which JAX leaves to XLA.
    assert "8.0" in attention.cudnn_unsupported_reason(64, jnp.bfloat16)
  with forced_cudnn((9, 0)), caplog.at_level("INFO"):
    assert attention.resolve_implementation("auto", 72, jnp.bfloat16) == "cudnn"
    assert attention.resolve_implementation("auto", 64, jnp.float32) == "xla"
    with pytest.raises(ValueError, match="float32.*bfloat16"):
      attention.resolve_implementation("cudnn", 64, jnp.float32)
  assert "chose cudnn for head size 72" in caplog.text
  assert "chose xla for head size 64, dtype float32" in caplog.text


def test_multi_head_attention_splits_heads_like_torch():
  """The fused kernel is [q | k | v], each split into heads in order."""
  width, heads = 8, 2
  layer = attention.MultiHeadAttention(
    width, heads, implementation="xla", rngs=nnx.Rngs(0)
  )
  x = jax.random.normal(jax.random.key(1), (2, 5, width))
  qkv = x @ layer.qkv.kernel[...] + layer.qkv.bias[...]
  q, k, v = (
    qkv[..., i * width : (i + 1) * width].reshape(2, 5, heads, -1)
    for i in range(3)
  )
  expected = (
    reference_attention(q, k, v).reshape(2, 5, width) @ layer.out.kernel[...]
    + layer.out.bias[...]
  )
  np.testing.assert_allclose(layer(x), expected, atol=1e-5)


# Token counts of the towers vidjax trains: CLIP vision at 1, 4 and 16 frames
# (1 + 196 T), the CLIP text tower (77, causal), VideoMAE / K400 (1568), the
# VideoMAE encoder's visible tokens (160).
TOWER_LENGTHS = [
  (197, False),
  (785, False),
  (3137, False),
  (77, True),
  (1568, False),
  (160, False),
]


@pytest.mark.parametrize("length,is_causal", TOWER_LENGTHS)
def test_cudnn_training_path_lowers_for_cuda_at_every_tower_length(
  length, is_causal
):
  """Forward and backward through cuDNN, traced as on an H100/H200.

  JAX 0.10-0.11 raise `Unsupported sequence length` here for odd lengths
  unless the tokens are padded (see attention.py).
  """
  q = jax.ShapeDtypeStruct((2, length, 12, 64), jnp.bfloat16)

  def loss(q, k, v):
    out = attention.dot_product_attention(
      q, k, v, implementation="cudnn", is_causal=is_causal
    )
    return jnp.sum(out.astype(jnp.float32) ** 2)

  with forced_cudnn():
    hlo = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
  calls = cudnn_attention_calls(hlo)
  assert calls.get("__cudnn$fmhaSoftmax") == 1, calls
  assert calls.get("__cudnn$fmhaSoftmaxBackward") == 1, calls


@pytest.mark.parametrize("is_causal", [False, True])
def test_cudnn_padding_and_masking_give_unpadded_attention(
  monkeypatch, is_causal
):
  """The padded cuDNN path, run by XLA on CPU, equals plain attention.

  Only the kernel is swapped (cuDNN cannot run here); the padding, the key
  masking through `key_value_seq_lengths` and the slicing are the real ones.
  """
  real = jax.nn.dot_product_attention

  def as_xla(*args, implementation, **kwargs):
    assert implementation == "cudnn"
    return real(*args, implementation="xla", **kwargs)

  q, k, v = _qkv(shape=(2, 13, 3, 16))  # 13 tokens: padded to 16.
  monkeypatch.setattr(attention, "resolve_implementation", lambda *a: "cudnn")
  monkeypatch.setattr(attention.jax.nn, "dot_product_attention", as_xla)

  def loss(fn, q, k, v):
    return jnp.sum(jnp.sin(fn(q, k, v)))

  ours = lambda q, k, v: attention.dot_product_attention(
    q, k, v, implementation="cudnn", is_causal=is_causal
  )
  ref = lambda q, k, v: reference_attention(q, k, v, is_causal)
  np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), atol=1e-6)
  grads = jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2))(q, k, v)
  ref_grads = jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2))(q, k, v)
  for g, rg in zip(grads, ref_grads):
    np.testing.assert_allclose(g, rg, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [197, 198, 785])
@pytest.mark.parametrize("is_causal", [False, True])
def test_cudnn_matches_xla_in_bfloat16(is_causal, length):
  q, k, v = _qkv(jnp.bfloat16, shape=(4, length, 12, 64))

  def run(implementation):
    fn = lambda q, k, v: jnp.sum(
      attention.dot_product_attention(
        q, k, v, implementation=implementation, is_causal=is_causal
      ).astype(jnp.float32)
      ** 2
    )
    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(q, k, v)

  (loss, grads), (ref_loss, ref_grads) = run("cudnn"), run("xla")
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-2)
  for g, rg in zip(grads, ref_grads):
    np.testing.assert_allclose(
      np.asarray(g, np.float32),
      np.asarray(rg, np.float32),
      atol=5e-2,
      rtol=5e-2,
    )
