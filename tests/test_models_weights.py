"""Weight import: CLIP and VideoMAE state dicts land where they should.

The CLIP checks compare against a small numpy implementation of OpenAI's
CLIP written from its state-dict names, so they run without torch; the
OpenCLIP comparison is in test_models_clip_parity.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidjax.models import weights
from vidjax.models.vit import patchify

WIDTH, PATCH, GRID, TEXT_WIDTH, CONTEXT, VOCAB, EMBED = 64, 8, 2, 64, 12, 50, 16


def random_clip_state_dict(seed=0, layers=2):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  sd = {
    'visual.conv1.weight': normal(WIDTH, 3, PATCH, PATCH),
    'visual.class_embedding': normal(WIDTH),
    'visual.positional_embedding': normal(1 + GRID * GRID, WIDTH),
    'visual.proj': normal(WIDTH, EMBED),
    'token_embedding.weight': normal(VOCAB, TEXT_WIDTH),
    'positional_embedding': normal(CONTEXT, TEXT_WIDTH),
    'text_projection': normal(TEXT_WIDTH, EMBED),
    'logit_scale': np.float32(np.log(1 / 0.07)),
  }
  for prefix, width in (
    ('visual.ln_pre', WIDTH),
    ('visual.ln_post', WIDTH),
    ('ln_final', TEXT_WIDTH),
  ):
    sd[f'{prefix}.weight'], sd[f'{prefix}.bias'] = (
      1 + normal(width),
      normal(width),
    )
  for tower, width in (
    ('visual.transformer', WIDTH),
    ('transformer', TEXT_WIDTH),
  ):
    for i in range(layers):
      p = f'{tower}.resblocks.{i}.'
      for name, shape in (
        ('attn.in_proj_weight', (3 * width, width)),
        ('attn.in_proj_bias', (3 * width,)),
        ('attn.out_proj.weight', (width, width)),
        ('attn.out_proj.bias', (width,)),
        ('mlp.c_fc.weight', (4 * width, width)),
        ('mlp.c_fc.bias', (4 * width,)),
        ('mlp.c_proj.weight', (width, 4 * width)),
        ('mlp.c_proj.bias', (width,)),
        ('ln_1.bias', (width,)),
        ('ln_2.bias', (width,)),
      ):
        sd[p + name] = normal(*shape)
      sd[p + 'ln_1.weight'], sd[p + 'ln_2.weight'] = (
        1 + normal(width),
        1 + normal(width),
      )
  return sd


# A reference CLIP in numpy, per example, from OpenAI's definitions.
def _ln(x, sd, name):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * sd[f'{name}.weight'] + sd[
    f'{name}.bias'
  ]


def _block(x, sd, p, causal):
  heads = x.shape[-1] // 64
  h = (
    _ln(x, sd, p + 'ln_1') @ sd[p + 'attn.in_proj_weight'].T
    + sd[p + 'attn.in_proj_bias']
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
    @ sd[p + 'attn.out_proj.weight'].T
    + sd[p + 'attn.out_proj.bias']
  )
  h = (
    _ln(x, sd, p + 'ln_2') @ sd[p + 'mlp.c_fc.weight'].T
    + sd[p + 'mlp.c_fc.bias']
  )
  h = h / (1 + np.exp(-1.702 * h))
  return x + h @ sd[p + 'mlp.c_proj.weight'].T + sd[p + 'mlp.c_proj.bias']


def numpy_clip_image(sd, image):
  """image: [H, W, 3] -> [EMBED]."""
  cells = image.reshape(GRID, PATCH, GRID, PATCH, 3)
  patches = np.einsum('iyjxc,dcyx->ijd', cells, sd['visual.conv1.weight'])
  x = (
    np.concatenate(
      [sd['visual.class_embedding'][None], patches.reshape(-1, WIDTH)]
    )
    + sd['visual.positional_embedding']
  )
  x = _ln(x, sd, 'visual.ln_pre')
  for i in range(2):
    x = _block(x, sd, f'visual.transformer.resblocks.{i}.', causal=False)
  return _ln(x[0], sd, 'visual.ln_post') @ sd['visual.proj']


def numpy_clip_text(sd, tokens):
  x = sd['token_embedding.weight'][tokens] + sd['positional_embedding']
  for i in range(2):
    x = _block(x, sd, f'transformer.resblocks.{i}.', causal=True)
  return _ln(x[np.argmax(tokens)], sd, 'ln_final') @ sd['text_projection']


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


@pytest.mark.parametrize('scan', [False, True])
def test_clip_from_state_dict_matches_a_reference_clip(scan):
  sd = random_clip_state_dict()
  model = weights.clip_from_state_dict(
    sd, scan=scan, attention='xla', remat='full' if scan else 'none'
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
  del sd['visual.ln_post.bias']
  sd['visual.extra_thing'] = np.zeros(3, np.float32)
  sd['visual.proj'] = np.zeros((WIDTH, EMBED + 1), np.float32)
  sd['text_projection'] = np.zeros((TEXT_WIDTH, EMBED + 1), np.float32)
  sd['visual.transformer.resblocks.1.mlp.c_fc.bias'] = np.zeros(7, np.float32)
  with pytest.raises(ValueError) as error:
    weights.clip_from_state_dict(sd)
  message = str(error.value)
  assert 'missing (1): visual.norm.bias' in message
  assert 'unexpected (1): visual.extra_thing' in message
  assert 'visual.transformer.resblocks.1.mlp.c_fc.bias (7,)' in message
  with pytest.raises(ValueError, match="not a CLIP state dict.*'visual.conv1"):
    weights.clip_from_state_dict({'a': np.zeros(1)})


def _write_safetensors(path, tensors):
  header, offset, blobs = {}, 0, []
  for name, array in tensors.items():
    blob = np.ascontiguousarray(array, np.float32).tobytes()
    header[name] = dict(
      dtype='F32',
      shape=list(np.shape(array)),
      data_offsets=[offset, offset + len(blob)],
    )
    offset += len(blob)
    blobs.append(blob)
  encoded = json.dumps(header).encode()
  path.write_bytes(
    len(encoded).to_bytes(8, 'little') + encoded + b''.join(blobs)
  )


def test_checkpoint_files_npz_safetensors_and_torch(tmp_path):
  sd = random_clip_state_dict(layers=1)
  np.savez(tmp_path / 'clip.npz', **sd)
  _write_safetensors(tmp_path / 'clip.safetensors', sd)
  for name in ('clip.npz', 'clip.safetensors'):
    loaded = weights.load_state_dict(str(tmp_path / name))
    assert loaded.keys() == sd.keys()
    np.testing.assert_array_equal(loaded['visual.proj'], sd['visual.proj'])
  with pytest.raises(ValueError, match='unknown checkpoint format'):
    weights.load_state_dict(str(tmp_path / 'clip.h5'))
  torch = pytest.importorskip('torch')
  torch.save(
    {
      'state_dict': {
        f'module.{k}': torch.from_numpy(np.asarray(v)).half()
        for k, v in sd.items()
      }
    },
    tmp_path / 'clip.pt',
  )
  loaded = weights.load_state_dict(str(tmp_path / 'clip.pt'))
  assert loaded['visual.proj'].dtype == np.float32
  np.testing.assert_allclose(
    loaded['visual.proj'], sd['visual.proj'], atol=1e-3
  )


def test_resolution_change_and_tubelet_inflation():
  sd = random_clip_state_dict(layers=1)
  bigger = weights.clip_from_state_dict(sd, image_size=32)
  table = bigger.visual.spatial_pos[...]
  assert table.shape == (1 + 16, WIDTH)
  np.testing.assert_array_equal(table[0], sd['visual.positional_embedding'][0])
  constant = np.ones((5, 3), np.float32)
  np.testing.assert_allclose(
    weights.interpolate_pos_embed(constant, 17), 1, atol=1e-5
  )
  # A static clip through an inflated tubelet embeds like the image does.
  image_tokens = patchify(IMAGES[:, None], 1, PATCH) @ weights.conv_to_kernel(
    sd['visual.conv1.weight'][:, :, None]
  )
  for mode in ('center', 'average'):
    model = weights.clip_from_state_dict(
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
    'encoder.patch_embed.proj.weight': normal(width, 3, 2, PATCH, PATCH),
    'encoder.patch_embed.proj.bias': normal(width),
    'encoder.norm.weight': 1 + normal(width),
    'encoder.norm.bias': normal(width),
    'encoder_to_decoder.weight': normal(decoder_width, width),
    'mask_token': normal(1, 1, decoder_width),
    'decoder.norm.weight': 1 + normal(decoder_width),
    'decoder.norm.bias': normal(decoder_width),
    'decoder.head.weight': normal(2 * PATCH * PATCH * 3, decoder_width),
    'decoder.head.bias': normal(2 * PATCH * PATCH * 3),
  }
  for prefix, w in (
    ('encoder.blocks.0.', width),
    ('decoder.blocks.0.', decoder_width),
  ):
    for name, shape in (
      ('norm1.weight', (w,)),
      ('norm1.bias', (w,)),
      ('attn.qkv.weight', (3 * w, w)),
      ('attn.q_bias', (w,)),
      ('attn.v_bias', (w,)),
      ('attn.proj.weight', (w, w)),
      ('attn.proj.bias', (w,)),
      ('norm2.weight', (w,)),
      ('norm2.bias', (w,)),
      ('mlp.fc1.weight', (4 * w, w)),
      ('mlp.fc1.bias', (4 * w,)),
      ('mlp.fc2.weight', (w, 4 * w)),
      ('mlp.fc2.bias', (w,)),
    ):
      sd[prefix + name] = normal(*shape)
  return sd


def to_hugging_face(sd):
  """The same weights under transformers' VideoMAEForPreTraining names."""
  out = {}
  for name, value in sd.items():
    for old, new in (
      (
        'encoder.patch_embed.proj',
        'videomae.embeddings.patch_embeddings.projection',
      ),
      ('encoder.blocks.', 'videomae.encoder.layer.'),
      ('decoder.blocks.', 'decoder.decoder_layers.'),
      ('encoder.norm.', 'videomae.layernorm.'),
      ('attn.proj.', 'attention.output.dense.'),
      ('norm1.', 'layernorm_before.'),
      ('norm2.', 'layernorm_after.'),
      ('mlp.fc1.', 'intermediate.dense.'),
      ('mlp.fc2.', 'output.dense.'),
      ('attn.q_bias', 'attention.attention.q_bias'),
      ('attn.v_bias', 'attention.attention.v_bias'),
    ):
      name = name.replace(old, new)
    if name.endswith('attn.qkv.weight'):
      stem = name[: -len('attn.qkv.weight')]
      for part, array in zip(('query', 'key', 'value'), np.split(value, 3)):
        out[f'{stem}attention.attention.{part}.weight'] = array
    else:
      out[name] = value
  return out


def test_videomae_original_and_hugging_face_names_give_the_same_model():
  sd = random_videomae_state_dict()
  original = weights.videomae_from_state_dict(
    sd, image_size=16, num_frames=4, mask_ratio=0.5
  )
  hf = weights.videomae_from_state_dict(
    to_hugging_face(sd), image_size=16, num_frames=4, mask_ratio=0.5
  )
  assert original.encoder.grid == (2, 2, 2)
  qkv_bias = original.encoder.blocks.layers[0].attn.qkv.bias[...]
  np.testing.assert_array_equal(qkv_bias[64:128], 0)  # keys have no bias
  np.testing.assert_array_equal(
    qkv_bias[128:], sd['encoder.blocks.0.attn.v_bias']
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
    k[len('encoder.') :]: v
    for k, v in random_videomae_state_dict().items()
    if k.startswith('encoder.') and not k.startswith('encoder.norm')
  }
  rng = np.random.default_rng(0)
  finetuned.update(
    {
      'fc_norm.weight': np.ones(64, np.float32),
      'fc_norm.bias': np.zeros(64, np.float32),
      'head.weight': rng.standard_normal((7, 64)).astype(np.float32),
      'head.bias': np.zeros(7, np.float32),
    }
  )
  same = weights.classifier_from_state_dict(
    finetuned, num_classes=7, image_size=16, num_frames=4
  )
  np.testing.assert_array_equal(
    same.head.kernel[...], finetuned['head.weight'].T
  )
  assert same.encoder.pool == 'mean'
  fresh = weights.classifier_from_state_dict(
    finetuned, num_classes=3, image_size=16, num_frames=4
  )
  assert fresh.head.kernel[...].shape == (64, 3)
  sd = random_clip_state_dict(layers=1)
  from_clip = weights.classifier_from_state_dict(sd, num_classes=4)
  np.testing.assert_array_equal(
    from_clip.encoder.class_token[...], sd['visual.class_embedding']
  )
  assert from_clip.encoder.pool == 'token' and from_clip.encoder.proj is None
