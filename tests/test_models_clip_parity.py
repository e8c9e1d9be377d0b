"""Parity with OpenCLIP: same image and text embeddings from the same weights.

Needs open_clip_torch (skipped otherwise). On x86_64 with Python 3.11:
  pip install torch==2.14.1 torchvision==0.29.1 open_clip_torch
then  python -m pytest tests/test_models_clip_parity.py
No pretrained weights are downloaded: the OpenCLIP model is random.
"""
import numpy as np
import pytest

open_clip = pytest.importorskip('open_clip')
torch = pytest.importorskip('torch')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from vidjax.models.weights import clip_from_state_dict  # noqa: E402


def test_random_openclip_vit_b16_matches_in_float32():
  torch.manual_seed(0)
  reference = open_clip.create_model('ViT-B-16', pretrained=None).eval()
  # OpenCLIP's ViT-B-16 config uses nn.GELU; OpenAI's weights use QuickGELU.
  model = clip_from_state_dict(reference.state_dict(), act='gelu',
                               dtype=jnp.float32, attention='xla')
  rng = np.random.default_rng(0)
  images = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
  tokens = np.zeros((2, 77), np.int64)
  tokens[0, :5] = [49406, 320, 1125, 539, 49407]  # start, 3 words, end
  tokens[1, :3] = [49406, 2368, 49407]
  with torch.no_grad():
    expected_image = reference.encode_image(torch.from_numpy(images)).numpy()
    expected_text = reference.encode_text(torch.from_numpy(tokens)).numpy()

  video = jnp.asarray(images.transpose(0, 2, 3, 1))[:, None]  # one frame
  image = jax.jit(lambda v: model.encode_video(v))(video)
  text = jax.jit(lambda t: model.encode_text(t))(jnp.asarray(tokens, jnp.int32))
  image_diff = np.abs(np.asarray(image) - expected_image).max()
  text_diff = np.abs(np.asarray(text) - expected_text).max()
  print(f'max abs diff: image {image_diff:.2e}, text {text_diff:.2e}')
  assert image_diff <= 1e-4
  assert text_diff <= 1e-4
