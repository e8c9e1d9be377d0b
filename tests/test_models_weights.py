"""Weight import: CLIP and VideoMAE state dicts land where they should.

The CLIP checks compare against a small numpy implementation of OpenAI's
CLIP written from its state-dict names, so they run without torch; the
other layouts (Hugging Face, AVION) are checked to give the same tensors as
the names they rename. The OpenCLIP comparison (OpenAI's TorchScript
archive, AVION's checkpoint) is in test_models_clip_parity.py.
"""

import importlib.util
import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reference import make_reference
from vidjax.base import errors
from vidjax.models.vit import patchify
from vidjax.weights import conversion, tensor_io

WIDTH, PATCH, GRID, TEXT_WIDTH, CONTEXT, VOCAB, EMBED = 64, 8, 2, 64, 12, 50, 16


def random_clip_state_dict(seed=0, layers=2):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  sd = {
    "visual.conv1.weight": normal(WIDTH, 3, PATCH, PATCH),
    "visual.class_embedding": normal(WIDTH),
    "visual.positional_embedding": normal(1 + GRID * GRID, WIDTH),
    "visual.proj": normal(WIDTH, EMBED),
    "token_embedding.weight": normal(VOCAB, TEXT_WIDTH),
    "positional_embedding": normal(CONTEXT, TEXT_WIDTH),
    "text_projection": normal(TEXT_WIDTH, EMBED),
    "logit_scale": np.float32(np.log(1 / 0.07)),
  }
  for prefix, width in (
    ("visual.ln_pre", WIDTH),
    ("visual.ln_post", WIDTH),
    ("ln_final", TEXT_WIDTH),
  ):
    sd[f"{prefix}.weight"], sd[f"{prefix}.bias"] = (
      1 + normal(width),
      normal(width),
    )
  for tower, width in (
    ("visual.transformer", WIDTH),
    ("transformer", TEXT_WIDTH),
  ):
    for i in range(layers):
      p = f"{tower}.resblocks.{i}."
      for name, shape in (
        ("attn.in_proj_weight", (3 * width, width)),
        ("attn.in_proj_bias", (3 * width,)),
        ("attn.out_proj.weight", (width, width)),
        ("attn.out_proj.bias", (width,)),
        ("mlp.c_fc.weight", (4 * width, width)),
        ("mlp.c_fc.bias", (4 * width,)),
        ("mlp.c_proj.weight", (width, 4 * width)),
        ("mlp.c_proj.bias", (width,)),
        ("ln_1.bias", (width,)),
        ("ln_2.bias", (width,)),
      ):
        sd[p + name] = normal(*shape)
      sd[p + "ln_1.weight"], sd[p + "ln_2.weight"] = (
        1 + normal(width),
        1 + normal(width),
      )
  return sd


# A reference CLIP in numpy, per example, from OpenAI's definitions.
def _ln(x, sd, name):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * sd[f"{name}.weight"] + sd[
    f"{name}.bias"
  ]


def _block(x, sd, p, causal):
  heads = x.shape[-1] // 64
  h = (
    _ln(x, sd, p + "ln_1") @ sd[p + "attn.in_proj_weight"].T
    + sd[p + "attn.in_proj_bias"]
  )
  q, k, v = (
    a.reshape(len(x), heads, -1).transpose(1, 0, 2) for a in np.split(h, 3, -1)
  )
  logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
  if causal:
    logits = np.where(np.tril(np.ones(logits.shape[1:], bool)), logits, -np.inf)
  weights_ = np.exp(logits - logits.max(-1, keepdims=True))
  attended = (weights_ / weights_.sum(-1, keepdims=True)) @ v
  x = (
    x
    + attended.transpose(1, 0, 2).reshape(x.shape)
    @ sd[p + "attn.out_proj.weight"].T
    + sd[p + "attn.out_proj.bias"]
  )
  h = (
    _ln(x, sd, p + "ln_2") @ sd[p + "mlp.c_fc.weight"].T
    + sd[p + "mlp.c_fc.bias"]
  )
  h = h / (1 + np.exp(-1.702 * h))
  return x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]


def numpy_clip_image(sd, image):
  """image: [H, W, 3] -> [EMBED]."""
  cells = image.reshape(GRID, PATCH, GRID, PATCH, 3)
  patches = np.einsum("iyjxc,dcyx->ijd", cells, sd["visual.conv1.weight"])
  x = (
    np.concatenate(
      [sd["visual.class_embedding"][None], patches.reshape(-1, WIDTH)]
    )
    + sd["visual.positional_embedding"]
  )
  x = _ln(x, sd, "visual.ln_pre")
  for i in range(2):
    x = _block(x, sd, f"visual.transformer.resblocks.{i}.", causal=False)
  return _ln(x[0], sd, "visual.ln_post") @ sd["visual.proj"]


def numpy_clip_text(sd, tokens):
  x = sd["token_embedding.weight"][tokens] + sd["positional_embedding"]
  for i in range(2):
    x = _block(x, sd, f"transformer.resblocks.{i}.", causal=True)
  return _ln(x[np.argmax(tokens)], sd, "ln_final") @ sd["text_projection"]


IMAGES = (
  np.random.default_rng(1).standard_normal((2, 16, 16, 3)).astype(np.float32)
)
TOKENS = np.array(
  [
    [49 - 1, 3, 7, 49, 0, 0, 0, 0, 0, 0, 0, 0],
    [48, 5, 49, 0, 0, 0, 0, 0, 0, 0, 0, 0],
  ],
  np.int32,
)


def encode(model, images=IMAGES):
  video = jnp.asarray(images)[:, None]
  return nnx.jit(lambda m: (m.encode_video(video), m.encode_text(TOKENS)))(
    model
  )


@pytest.mark.parametrize("scan", [False, True])
def test_clip_from_state_dict_matches_a_reference_clip(scan):
  sd = random_clip_state_dict()
  model = conversion.clip_from_state_dict(
    sd, scan=scan, attention="xla", remat="full" if scan else "none"
  )
  image_embedding, text_embedding = encode(model)
  for i in range(2):
    np.testing.assert_allclose(
      image_embedding[i], numpy_clip_image(sd, IMAGES[i]), atol=1e-4
    )
    np.testing.assert_allclose(
      text_embedding[i], numpy_clip_text(sd, TOKENS[i]), atol=1e-4
    )
  np.testing.assert_allclose(
    model.logit_scale[...], np.log(1 / 0.07), rtol=1e-6
  )
  assert model.visual.temporal_pos[...].shape == (1, WIDTH)


def test_mismatch_lists_missing_unexpected_and_shapes():
  sd = random_clip_state_dict()
  del sd["visual.ln_post.bias"]
  sd["visual.extra_thing"] = np.zeros(3, np.float32)
  sd["visual.proj"] = np.zeros((WIDTH, EMBED + 1), np.float32)
  sd["text_projection"] = np.zeros((TEXT_WIDTH, EMBED + 1), np.float32)
  sd["visual.transformer.resblocks.1.mlp.c_fc.bias"] = np.zeros(7, np.float32)
  with pytest.raises(ValueError) as error:
    conversion.clip_from_state_dict(sd)
  message = str(error.value)
  assert "missing (1): visual.norm.bias" in message
  assert "unexpected (1): visual.extra_thing" in message
  assert "visual.transformer.resblocks.1.mlp.c_fc.bias (7,)" in message
  with pytest.raises(ValueError, match="not a CLIP or VideoMAE.*'a'"):
    conversion.clip_from_state_dict({"a": np.zeros(1)})


def write_safetensors(path, tensors, metadata=None):
  """A .safetensors file (`metadata`: e.g. save_pretrained's {'format': 'pt'})."""
  header, offset, blobs = (
    ({"__metadata__": metadata} if metadata else {}),
    0,
    [],
  )
  for name, array in tensors.items():
    blob = np.ascontiguousarray(array, np.float32).tobytes()
    header[name] = dict(
      dtype="F32",
      shape=list(np.shape(array)),
      data_offsets=[offset, offset + len(blob)],
    )
    offset += len(blob)
    blobs.append(blob)
  encoded = json.dumps(header).encode()
  path.write_bytes(
    len(encoded).to_bytes(8, "little") + encoded + b"".join(blobs)
  )


def test_bfloat16_safetensors_read_as_torch_wrote_them():
  """A bf16 file as save_pretrained writes it (safetensors.torch; committed
  by make_reference.bf16_safetensors), read without torch: each value
  equal to torch's own float32 of it."""
  want = make_reference.committed("bf16_safetensors")
  path = make_reference.HERE / "bf16.safetensors"
  loaded = tensor_io.load_state_dict(str(path))
  assert loaded.keys() == want.keys()
  for name, value in want.items():
    assert loaded[name].dtype == np.float32
    np.testing.assert_array_equal(loaded[name], value)


@pytest.mark.parity
def test_the_committed_torch_references_are_torchs():
  make_reference.check_live("bf16_safetensors")
  make_reference.check_live("temporal_resize", rtol=1e-6, atol=1e-7)


@pytest.mark.parity  # Its torch pickle part.
def test_checkpoint_files_npz_safetensors_and_torch(tmp_path):
  sd = random_clip_state_dict(layers=1)
  np.savez(tmp_path / "clip.npz", **sd)
  write_safetensors(tmp_path / "clip.safetensors", sd)
  for name in ("clip.npz", "clip.safetensors"):
    loaded = tensor_io.load_state_dict(str(tmp_path / name))
    assert loaded.keys() == sd.keys()
    np.testing.assert_array_equal(loaded["visual.proj"], sd["visual.proj"])
  (tmp_path / "clip.h5").write_bytes(b"x")
  with pytest.raises(ValueError, match="clip.h5: unknown checkpoint format"):
    tensor_io.load_state_dict(str(tmp_path / "clip.h5"))
  with pytest.raises(FileNotFoundError, match="nope.pt"):
    tensor_io.load_state_dict(str(tmp_path / "nope.pt"))
  torch = pytest.importorskip("torch")
  torch.save(
    {
      "state_dict": {
        f"module.{k}": torch.from_numpy(np.asarray(v)).half()
        for k, v in sd.items()
      }
    },
    tmp_path / "clip.pt",
  )
  loaded = tensor_io.load_state_dict(str(tmp_path / "clip.pt"))
  assert loaded["visual.proj"].dtype == np.float32
  np.testing.assert_allclose(
    loaded["visual.proj"], sd["visual.proj"], atol=1e-3
  )


def test_resolution_change_and_tubelet_inflation():
  sd = random_clip_state_dict(layers=1)
  bigger = conversion.clip_from_state_dict(sd, image_size=32)
  table = bigger.visual.spatial_pos[...]
  assert table.shape == (1 + 16, WIDTH)
  np.testing.assert_array_equal(table[0], sd["visual.positional_embedding"][0])
  constant = np.ones((5, 3), np.float32)
  np.testing.assert_allclose(
    tensor_io.interpolate_pos_embed(constant, 17), 1, atol=1e-5
  )
  # A static clip through an inflated tubelet embeds like the image does.
  image_tokens = patchify(IMAGES[:, None], 1, PATCH) @ tensor_io.conv_to_kernel(
    sd["visual.conv1.weight"][:, :, None]
  )
  for mode in ("center", "average"):
    model = conversion.clip_from_state_dict(
      sd, num_frames=2, tubelet=2, patch_inflation=mode
    )
    static = np.repeat(IMAGES[:, None], 2, axis=1)
    tokens = model.visual.patch_embed(patchify(static, 2, PATCH))
    np.testing.assert_allclose(tokens, image_tokens, atol=1e-4)


def random_videomae_state_dict(seed=0, width=64, decoder_width=64, classes=0):
  """Original VideoMAE pretraining names ('encoder.' prefix, q/v biases)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  sd = {
    "encoder.patch_embed.proj.weight": normal(width, 3, 2, PATCH, PATCH),
    "encoder.patch_embed.proj.bias": normal(width),
    "encoder.norm.weight": 1 + normal(width),
    "encoder.norm.bias": normal(width),
    "encoder_to_decoder.weight": normal(decoder_width, width),
    "mask_token": normal(1, 1, decoder_width),
    "decoder.norm.weight": 1 + normal(decoder_width),
    "decoder.norm.bias": normal(decoder_width),
    "decoder.head.weight": normal(2 * PATCH * PATCH * 3, decoder_width),
    "decoder.head.bias": normal(2 * PATCH * PATCH * 3),
  }
  for prefix, w in (
    ("encoder.blocks.0.", width),
    ("decoder.blocks.0.", decoder_width),
  ):
    for name, shape in (
      ("norm1.weight", (w,)),
      ("norm1.bias", (w,)),
      ("attn.qkv.weight", (3 * w, w)),
      ("attn.q_bias", (w,)),
      ("attn.v_bias", (w,)),
      ("attn.proj.weight", (w, w)),
      ("attn.proj.bias", (w,)),
      ("norm2.weight", (w,)),
      ("norm2.bias", (w,)),
      ("mlp.fc1.weight", (4 * w, w)),
      ("mlp.fc1.bias", (4 * w,)),
      ("mlp.fc2.weight", (w, 4 * w)),
      ("mlp.fc2.bias", (w,)),
    ):
      sd[prefix + name] = normal(*shape)
  return sd


def to_hugging_face(sd):
  """The same weights under transformers' VideoMAEForPreTraining names."""
  out = {}
  for name, value in sd.items():
    for old, new in (
      (
        "encoder.patch_embed.proj",
        "videomae.embeddings.patch_embeddings.projection",
      ),
      ("encoder.blocks.", "videomae.encoder.layer."),
      ("decoder.blocks.", "decoder.decoder_layers."),
      ("encoder.norm.", "videomae.layernorm."),
      ("attn.proj.", "attention.output.dense."),
      ("norm1.", "layernorm_before."),
      ("norm2.", "layernorm_after."),
      ("mlp.fc1.", "intermediate.dense."),
      ("mlp.fc2.", "output.dense."),
      ("attn.q_bias", "attention.attention.q_bias"),
      ("attn.v_bias", "attention.attention.v_bias"),
    ):
      name = name.replace(old, new)
    if name.endswith("attn.qkv.weight"):
      stem = name[: -len("attn.qkv.weight")]
      for part, array in zip(("query", "key", "value"), np.split(value, 3)):
        out[f"{stem}attention.attention.{part}.weight"] = array
    else:
      out[name] = value
  return out


def test_videomae_original_and_hugging_face_names_give_the_same_model():
  sd = random_videomae_state_dict()
  original = conversion.videomae_from_state_dict(
    sd, image_size=16, num_frames=4, mask_ratio=0.5
  )
  hf = conversion.videomae_from_state_dict(
    to_hugging_face(sd), image_size=16, num_frames=4, mask_ratio=0.5
  )
  assert original.encoder.grid == (2, 2, 2)
  qkv_bias = original.encoder.blocks.layers[0].attn.qkv.bias[...]
  np.testing.assert_array_equal(qkv_bias[64:128], 0)  # keys have no bias
  np.testing.assert_array_equal(
    qkv_bias[128:], sd["encoder.blocks.0.attn.v_bias"]
  )
  for a, b in zip(
    jax.tree.leaves(nnx.state(original, nnx.Param)),
    jax.tree.leaves(nnx.state(hf, nnx.Param)),
  ):
    np.testing.assert_array_equal(a, b)
  video = jax.random.normal(jax.random.key(0), (1, 4, 16, 16, 3))
  mask = jnp.array([[True, False, True, False] * 2])
  assert np.isfinite(nnx.jit(lambda m: m(video, mask))(original))


def test_classifier_from_videomae_and_clip_checkpoints():
  finetuned = {
    k[len("encoder.") :]: v
    for k, v in random_videomae_state_dict().items()
    if k.startswith("encoder.") and not k.startswith("encoder.norm")
  }
  rng = np.random.default_rng(0)
  finetuned.update(
    {
      "fc_norm.weight": np.ones(64, np.float32),
      "fc_norm.bias": np.zeros(64, np.float32),
      "head.weight": rng.standard_normal((7, 64)).astype(np.float32),
      "head.bias": np.zeros(7, np.float32),
    }
  )
  same = conversion.classifier_from_state_dict(
    finetuned, num_classes=7, image_size=16, num_frames=4
  )
  np.testing.assert_array_equal(
    same.head.kernel[...], finetuned["head.weight"].T
  )
  assert same.encoder.pool == "mean"
  fresh = conversion.classifier_from_state_dict(
    finetuned, num_classes=3, image_size=16, num_frames=4
  )
  assert fresh.head.kernel[...].shape == (64, 3)
  sd = random_clip_state_dict(layers=1)
  from_clip = conversion.classifier_from_state_dict(sd, num_classes=4)
  np.testing.assert_array_equal(
    from_clip.encoder.class_token[...], sd["visual.class_embedding"]
  )
  assert from_clip.encoder.pool == "token" and from_clip.encoder.proj is None


def to_hugging_face_clip(sd):
  """The same weights under transformers' CLIPModel names (split q/k/v)."""
  prefixes = (
    ("visual.conv1.", "vision_model.embeddings.patch_embedding."),
    ("visual.class_embedding", "vision_model.embeddings.class_embedding"),
    (
      "visual.positional_embedding",
      "vision_model.embeddings.position_embedding.weight",
    ),
    ("visual.ln_pre.", "vision_model.pre_layrnorm."),
    ("visual.ln_post.", "vision_model.post_layernorm."),
    ("visual.transformer.resblocks.", "vision_model.encoder.layers."),
    ("token_embedding.", "text_model.embeddings.token_embedding."),
    ("positional_embedding", "text_model.embeddings.position_embedding.weight"),
    ("transformer.resblocks.", "text_model.encoder.layers."),
    ("ln_final.", "text_model.final_layer_norm."),
  )
  parts = (
    (".ln_1.", ".layer_norm1."),
    (".ln_2.", ".layer_norm2."),
    (".mlp.c_fc.", ".mlp.fc1."),
    (".mlp.c_proj.", ".mlp.fc2."),
    (".attn.out_proj.", ".self_attn.out_proj."),
  )
  out = {"text_model.embeddings.position_ids": np.arange(CONTEXT)[None]}
  for name, value in sd.items():
    if name in ("visual.proj", "text_projection"):  # Linear weights [E, D]
      key = "visual_projection" if name == "visual.proj" else "text_projection"
      out[f"{key}.weight"] = value.T
      continue
    for old, new in prefixes:
      if name.startswith(old):
        name = new + name[len(old) :]
        break
    for old, new in parts:
      name = name.replace(old, new)
    if ".attn.in_proj_" in name:
      stem, kind = name.split(".attn.in_proj_")
      for part, array in zip("qkv", np.split(value, 3)):
        out[f"{stem}.self_attn.{part}_proj.{kind}"] = array
    else:
      out[name] = value
  return out


def assert_same_source(a, b):
  assert a.kind == b.kind and a.tensors.keys() == b.tensors.keys()
  for path in a.tensors:
    np.testing.assert_array_equal(a.tensors[path], b.tensors[path], path)


def test_hugging_face_clip_names_give_the_same_tensors():
  sd = random_clip_state_dict()
  hf = conversion.convert(to_hugging_face_clip(sd), "hf")
  assert hf.description == "hf (Hugging Face CLIP)" and not hf.unexpected
  assert_same_source(hf, conversion.convert(sd))


def to_avion_videomae(sd, finetuned=False):
  """AVION's --use-flash-attn --channel-last names for the same weights."""
  out = {}
  for name, value in sd.items():
    stem, _, leaf = name.rpartition(".attn.")
    if leaf == "q_bias":  # Its fine-tuning script builds the one bias so.
      v_bias = sd[f"{stem}.attn.v_bias"]
      value = np.concatenate([value, np.zeros_like(value), v_bias])
      name = f"{stem}.attn.Wqkv.bias"
    elif leaf == "v_bias":
      continue
    name = name.replace(".attn.qkv.", ".attn.Wqkv.")
    name = name.replace(".attn.proj.", ".attn.out_proj.")
    if name.endswith("patch_embed.proj.weight"):  # Linear over (c, t, y, x)
      value = value.reshape(value.shape[0], -1)
    if finetuned:
      name = name.removeprefix("encoder.")
    out[name] = value
  return out


def test_avion_videomae_names_give_the_same_tensors():
  sd = random_videomae_state_dict()
  avion = conversion.convert(to_avion_videomae(sd), "avion")
  assert avion.description == "avion (VideoMAE (AVION))"
  assert avion.kind == "videomae" and avion.tubelet == 2
  assert_same_source(avion, conversion.convert(sd))
  encoder = {k: v for k, v in sd.items() if k.startswith("encoder.blocks")}
  encoder["encoder.patch_embed.proj.weight"] = sd[
    "encoder.patch_embed.proj.weight"
  ]
  encoder["encoder.fc_norm.weight"] = np.ones(64, np.float32)
  encoder["encoder.fc_norm.bias"] = np.zeros(64, np.float32)
  finetuned = conversion.convert(to_avion_videomae(encoder, finetuned=True))
  assert finetuned.kind == "classifier" and finetuned.backbone == "videomae"
  np.testing.assert_array_equal(
    finetuned.tensors["encoder.norm.scale"], np.ones(64)
  )


def test_lavila_timesformer_is_refused_with_the_reason():
  sd = {
    "visual.cls_token": np.zeros((1, 1, 8), np.float32),
    "visual.blocks.0.timeattn.qkv.weight": np.zeros((24, 8), np.float32),
  }
  with pytest.raises(ValueError, match="lavila.pt: a TimeSformer"):
    conversion.convert(sd, "lavila.pt")


class NotATensor:
  """A class a pickle can only build by running code."""


@pytest.mark.parity
def test_pickles_run_no_code_unless_allowed(tmp_path):
  torch = pytest.importorskip("torch")
  sd = {"visual.proj": torch.zeros(2, 2)}
  path = tmp_path / "trainer_state.pt"
  torch.save({"state_dict": sd, "trainer": NotATensor()}, path)
  with pytest.raises(ValueError, match="init_allow_pickle=True") as error:
    tensor_io.load_state_dict(str(path))
  assert str(path) in str(error.value) and "NotATensor" in str(error.value)
  loaded = tensor_io.load_state_dict(str(path), allow_pickle=True)
  assert list(loaded) == ["visual.proj"]


@pytest.mark.parity  # Its torch pickle part.
def test_damaged_files_are_named_without_a_traceback(tmp_path):
  # Partial downloads of each format, and an error page saved as weights.
  sd = {"visual.proj": np.ones((4, 4), np.float32)}
  write_safetensors(tmp_path / "whole.safetensors", sd)
  np.savez(tmp_path / "whole.npz", **sd)
  suffixes = [".safetensors", ".npz"]
  if importlib.util.find_spec("torch"):  # .pt files are read with torch.
    import torch

    torch.save(
      {k: torch.from_numpy(v) for k, v in sd.items()}, tmp_path / "whole.pt"
    )
    suffixes.append(".pt")
  for suffix in suffixes:
    whole = (tmp_path / f"whole{suffix}").read_bytes()
    (tmp_path / f"cut{suffix}").write_bytes(whole[: len(whole) // 2])
  (tmp_path / "page.pt").write_bytes(b"<html><body>404 Not Found</body></html>")
  names = [f"cut{s}" for s in suffixes] + ["page.pt"] * (".pt" in suffixes)
  for name in names:
    path = str(tmp_path / name)
    with pytest.raises(errors.InitFromError) as error:
      tensor_io.load_state_dict(path)
    message = str(error.value)
    assert message.startswith(f"{path}: cannot be read as ."), message
    assert len(message.splitlines()) == 1 and error.value.__cause__ is None


def test_temporal_table_resized_as_avion():
  # AVION's inflate_positional_embeds with load_temporal_fix='bilinear'
  # (torch's interpolate, committed by make_reference.temporal_resize).
  committed = make_reference.committed("temporal_resize")
  table, expected = committed["table"], committed["resized"]
  np.testing.assert_allclose(
    tensor_io.interpolate_temporal(table, 16), expected, atol=1e-6
  )
  np.testing.assert_array_equal(
    tensor_io.interpolate_temporal(table, 2), table[:2]
  )


def test_a_tensor_of_another_rank_is_refused_naming_it():
  sd = random_clip_state_dict()
  sd["visual.conv1.weight"] = np.asarray(sd["visual.conv1.weight"]).reshape(-1)
  with pytest.raises(errors.InitFromError) as e:
    conversion.convert(sd, "bad.pt")
  assert str(e.value).startswith(
    "bad.pt: the tensor visual.conv1.weight has shape (12288,), which is "
    "not the layout of visual.conv1.weight in a CLIP state dict"
  )
