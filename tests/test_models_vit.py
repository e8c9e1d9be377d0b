"""Video ViT: patch layout, positions, remat/scan equivalence, training use."""

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
from vidjax.config.defaults import model_config, parse_variant
from vidjax.models import build_model, spec
from vidjax.models.transformer import Transformer
from vidjax.models.vit import VisionTransformer, num_kept_tokens, patchify


def tiny_vit(**overrides):
  kwargs = dict(
    width=32,
    depth=2,
    heads=2,
    patch_size=8,
    image_size=16,
    num_frames=4,
    tubelet=2,
    output_dim=8,
    attention="xla",
    drop_path=0.2,
  )
  kwargs.update(overrides)
  return VisionTransformer(spec.fill(spec.Vision, kwargs), rngs=nnx.Rngs(0))


def video(shape=(2, 4, 16, 16, 3), seed=1):
  return jax.random.normal(jax.random.key(seed), shape)


def test_patch_embedding_is_a_strided_conv3d_in_time_row_column_order():
  model = tiny_vit(pos_embed="sincos", class_token=False, pool="none")
  x = video()
  kernel = model.patch_embed.kernel[...].reshape(2, 8, 8, 3, 32)  # t p p C D
  conv = jax.lax.conv_general_dilated(
    x,
    kernel,
    window_strides=(2, 8, 8),
    padding="VALID",
    dimension_numbers=("NTHWC", "THWIO", "NTHWC"),
  )
  np.testing.assert_allclose(
    model.patch_embed(patchify(x, 2, 8)), conv.reshape(2, -1, 32), atol=1e-4
  )


def test_masked_training_sees_the_class_token_and_the_kept_patches_only():
  """mask_ratio 0.5 over a 4 x 4 x 4 grid: in training each clip keeps 32
  of its 64 patches (its own draw; 'tube': the same 8 positions in every
  frame), and only those reach the output; evaluation sees every patch and
  computes what the unmasked model computes."""
  x, key = video((2, 4, 32, 32, 3)), jax.random.key(3)
  for kind in ("random", "tube"):
    model = tiny_vit(
      image_size=32, tubelet=1, drop_path=0.0, mask_ratio=0.5, mask_kind=kind
    )
    ids = np.asarray(model.kept_token_ids(2, key))
    assert ids.shape == (2, 32) == (2, num_kept_tokens(model.grid, 0.5, kind))
    for row in ids:
      assert np.all(np.diff(row) > 0) and 0 <= row[0] and row[-1] < 64
    assert not np.array_equal(ids[0], ids[1])
  frames, positions = np.divmod(ids.reshape(2, 4, 8), 16)  # 'tube'.
  assert np.all(frames == np.arange(4)[:, None])
  assert np.all(positions == positions[:, :1])

  def patch_mask(keep):  # [2, 4, 32, 32, 1]: 1 on the patches of `keep`.
    grid = np.zeros((2, 64))
    grid[np.arange(2)[:, None], keep] = 1
    grid = grid.reshape(2, 4, 4, 1, 4, 1, 1)
    return np.broadcast_to(grid, (2, 4, 4, 8, 4, 8, 1)).reshape(2, 4, 32, 32, 1)

  train = nnx.jit(lambda model, x: model(x, deterministic=False, rngs=key))
  trained = train(model, x)
  np.testing.assert_allclose(  # What is dropped changes nothing...
    train(model, x + 5 * (1 - patch_mask(ids))), trained, atol=1e-5
  )
  assert not np.allclose(  # ...a kept patch does.
    train(model, x + 5 * patch_mask(ids[:, :1])), trained, atol=1e-3
  )
  unmasked = tiny_vit(image_size=32, tubelet=1, drop_path=0.0)
  evaluate = nnx.jit(lambda model, x: model(x))
  np.testing.assert_array_equal(evaluate(model, x), evaluate(unmasked, x))


def test_parse_variant_and_bad_inputs():
  assert parse_variant("L/14") == dict(
    width=1024, depth=24, heads=16, mlp_dim=4096, patch_size=14
  )
  with pytest.raises(ValueError, match="variant"):
    parse_variant("XL/16")
  with pytest.raises(ValueError, match="does not match the model"):
    tiny_vit()(video((2, 2, 16, 16, 3)))


def test_temporal_embedding_starts_at_zero_so_one_frame_is_an_image_model():
  model = tiny_vit(num_frames=1, tubelet=1, drop_path=0.0)
  np.testing.assert_array_equal(model.temporal_pos[...], 0)
  frame = video((2, 1, 16, 16, 3))
  tokens = model.embed(frame)
  expected = (
    model.patch_embed(patchify(frame, 1, 8)) + model.spatial_pos[...][1:]
  )
  np.testing.assert_allclose(tokens, expected, atol=1e-6)


@pytest.mark.parametrize(
  "remat, scan",
  [("full", False), ("dots_saveable", True), ("save_attention", False)],
)
def test_remat_and_scan_change_nothing_numerically(remat, scan):
  base = tiny_vit()
  other = tiny_vit(remat=remat, scan=scan)
  # Same weights: copy the (unstacked) blocks into the stacked layout.
  base_params = nnx.state(base, nnx.Param)
  if scan:
    layers = base_params["blocks"]["layers"]
    stacked = jax.tree.map(
      lambda *xs: jnp.stack(xs), *[layers[i] for i in range(2)]
    )
    base_params["blocks"]["layers"] = stacked
  nnx.update(other, base_params)
  x = video()

  def value_and_grad(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
      model = nnx.merge(graphdef, params, rest)
      out = model(x, rngs=jax.random.key(3), deterministic=False)
      return jnp.sum(out**2)

    return jax.jit(jax.value_and_grad(loss))(params)

  value, grads = value_and_grad(base)
  other_value, other_grads = value_and_grad(other)
  np.testing.assert_allclose(value, other_value, rtol=1e-5)
  np.testing.assert_allclose(
    grads["patch_embed"]["kernel"],
    other_grads["patch_embed"]["kernel"],
    atol=1e-5,
  )


def test_drop_path_uses_the_dropout_stream_only_when_training():
  model = tiny_vit()
  x = video()
  np.testing.assert_array_equal(model(x), model(x, deterministic=True))
  first = model(x, deterministic=False)
  second = model(x, deterministic=False)  # the stored stream advanced
  assert not np.allclose(first, second)
  keyed = model(x, deterministic=False, rngs=jax.random.key(5))
  np.testing.assert_array_equal(
    keyed, model(x, deterministic=False, rngs=jax.random.key(5))
  )
  assert not np.allclose(keyed, model(x))


def test_split_merge_inside_jit_trains_with_dropout_state_threaded():
  model = tiny_vit()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def step(params, rest, x):
    def loss_fn(params):
      model = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest))
      loss = jnp.mean(model(x, deterministic=False) ** 2)
      return loss, nnx.state(model, nnx.Not(nnx.Param))

    (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, rest, loss

  x = video()
  params, rest1, loss1 = step(params, rest, x)
  params, rest2, loss2 = step(params, rest1, x)
  assert np.isfinite(loss1) and np.isfinite(loss2)
  counts = [
    int(r["blocks"]["dropout_rngs"]["count"][...]) for r in (rest, rest1, rest2)
  ]
  assert counts == sorted(set(counts))  # a fresh drop-path mask each step


def test_vit_b16_four_frames_forward_and_backward_on_cpu():
  """The real ViT-B/16 width and token count (4 frames, 785 tokens)."""
  config = model_config("clip")
  config.update(
    variant="B/16",
    depth=1,
    num_frames=4,
    dtype="float32",
    remat="full",
    attention="auto",
  )
  config.text.update(layers=1, width=64, heads=1, vocab_size=100)
  model = build_model(config, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def grads(params, rest, x):
    def loss(params):
      model = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest))
      return jnp.sum(model.encode_video(x, deterministic=False) ** 2)

    return jax.value_and_grad(loss)(params)

  loss, g = grads(params, rest, video((1, 4, 224, 224, 3)))
  assert np.isfinite(loss)
  assert g["visual"]["patch_embed"]["kernel"].shape == (768, 768)
  assert np.isfinite(np.asarray(g["visual"]["patch_embed"]["kernel"])).all()


def test_drop_path_schedule_linear_or_uniform_per_block():
  config = model_config("classifier")
  config.update(
    width=32, depth=4, heads=2, image_size=32, num_frames=2, drop_path=0.3
  )
  for schedule, rates in (
    ("linear", (0.0, 0.1, 0.2, 0.3)),
    ("uniform", (0.3,) * 4),
  ):  # AVION's CLIP classifier
    config.drop_path_schedule = schedule
    model = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(model.encoder.blocks.drop_rates, rates)
  config.drop_path_schedule = "cosine"
  with pytest.raises(ValueError, match="drop_path_schedule must be one of"):
    build_model(config, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("scan", [False, True])
def test_bfloat16_residual_stream_stays_bfloat16_and_close(scan):
  x = jax.random.normal(jax.random.key(2), (2, 9, 32))
  stacks = {}
  for residual in (jnp.float32, jnp.bfloat16):
    stacks[residual] = Transformer(
      spec.fill(
        spec.Stack,
        dict(
          width=32,
          depth=3,
          heads=2,
          mlp_dim=64,
          attention="xla",
          scan=scan,
          residual_dtype=residual,
        ),
      ),
      rngs=nnx.Rngs(0),
    )
  wide, narrow = stacks[jnp.float32](x), stacks[jnp.bfloat16](x)
  assert wide.dtype == jnp.float32 and narrow.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(narrow, np.float32), wide, rtol=0.05, atol=0.05
  )
  config = model_config("videomae")
  config.update(
    variant="Ti/16",
    depth=1,
    image_size=32,
    num_frames=2,
    mask_ratio=0.5,
    residual_dtype="bfloat16",
  )
  model = build_model(config, rngs=nnx.Rngs(0))
  assert model.encoder.blocks.residual_dtype == jnp.bfloat16


@pytest.mark.parametrize(
  "remat, reruns",
  [
    ("none", False),
    ("full", True),
    ("dots_saveable", True),
    ("save_attention", False),
    ("save_dots_and_attention", False),
  ],
)
def test_save_attention_keeps_what_cudnn_backward_needs(remat, reruns):
  """Under 'save_attention' the backward pass never reruns cuDNN's forward.

  cuDNN's backward needs the forward's softmax statistics as well as its
  output; keeping only the output would run the forward kernel again.
  """
  depth = 3
  with forced_cudnn():
    stack = nnx.eval_shape(
      lambda: Transformer(
        spec.fill(
          spec.Stack,
          dict(
            width=128,
            depth=depth,
            heads=2,
            mlp_dim=256,
            remat=remat,
            attention="cudnn",
            dtype=jnp.bfloat16,
          ),
        ),
        rngs=nnx.Rngs(0),
      )
    )
    graphdef, params, rest = nnx.split(stack, nnx.Param, ...)
    loss = lambda p, x: jnp.sum(nnx.merge(graphdef, p, rest)(x))
    hlo = lower_for_cuda(
      jax.grad(loss), params, jax.ShapeDtypeStruct((2, 197, 128), jnp.float32)
    )
  calls = cudnn_attention_calls(hlo)
  assert calls["backward"] == depth
  assert (calls["forward"] > depth) == reruns, calls
