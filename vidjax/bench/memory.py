"""Compiled memory of a training step under each remat policy.

Compiles (does not run) one step of a video CLIP: forward of both towers,
backward, and an SGD update with the parameters donated, then prints XLA's
`memory_analysis()` per remat policy and each total relative to the first.
Nothing is allocated, so large batches can be sized on any machine; the
figures are for the backend it runs on (on CPU, attention is XLA's and
keeps its T x T weights; on GPU with cuDNN it does not).

  python -m vidjax.bench.memory --variant B/16 --frames 16 --batch 4 \
      --remat none,full,dots_saveable

The loss is a stand-in (the mean similarity of paired embeddings): memory is
dominated by the towers' activations, not by the loss.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from vidjax.models import build_model, default_model_config

GiB = 1024**3


def step_memory(config, batch: int) -> dict[str, float]:
  """Compiles a training step for `config` and returns its memory in GiB.

  Returns:
    dict with 'arguments', 'outputs', 'aliased', 'temporaries', 'total'
    (arguments + outputs - aliased + temporaries) and 'compile_s'.
  """
  abstract = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  video = jax.ShapeDtypeStruct(
      (batch, config.num_frames, config.image_size, config.image_size, 3),
      jnp.float32)
  tokens = jax.ShapeDtypeStruct((batch, config.text.context_length),
                                jnp.int32)

  def loss_fn(params, rest, video, tokens):
    model = nnx.merge(graphdef, params, jax.tree.map(lambda x: x, rest))
    video_embedding, text_embedding = model(video, tokens,
                                            deterministic=False)
    return jnp.mean(jnp.sum(video_embedding * text_embedding, axis=-1))

  def train_step(params, rest, video, tokens):
    grads = jax.grad(loss_fn)(params, rest, video, tokens)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

  start = time.perf_counter()
  compiled = jax.jit(train_step, donate_argnums=0).lower(
      params, rest, video, tokens).compile()
  seconds = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  figures = dict(
      arguments=analysis.argument_size_in_bytes / GiB,
      outputs=analysis.output_size_in_bytes / GiB,
      aliased=analysis.alias_size_in_bytes / GiB,
      temporaries=analysis.temp_size_in_bytes / GiB)
  figures['total'] = (figures['arguments'] + figures['outputs']
                      - figures['aliased'] + figures['temporaries'])
  figures['compile_s'] = seconds
  return figures


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--variant', default='B/16')
  parser.add_argument('--frames', type=int, default=16)
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--dtype', default='bfloat16')
  parser.add_argument('--attention', default='auto')
  parser.add_argument('--remat', default='none,full',
                      help='comma-separated remat policies')
  parser.add_argument('--scan', action='store_true')
  args = parser.parse_args(argv)

  config = default_model_config('clip')
  config.update(variant=args.variant, num_frames=args.frames,
                image_size=args.image_size, dtype=args.dtype,
                attention=args.attention, scan=args.scan)
  print(f'CLIP {args.variant}, {args.frames} frames of {args.image_size}px, '
        f'batch {args.batch}, {args.dtype}, attention={args.attention}, '
        f'scan={args.scan}, backend {jax.default_backend()} '
        f'(jax {jax.__version__})')
  header = (f"{'remat':<34}{'args GiB':>10}{'out GiB':>10}{'alias GiB':>10}"
            f"{'temp GiB':>10}{'total GiB':>11}{'vs first':>10}"
            f"{'compile s':>11}")
  print(header)
  print('-' * len(header))
  first_total = None
  for policy in args.remat.split(','):
    config.remat = policy
    m = step_memory(config, args.batch)
    first_total = first_total or m['total']
    print(f"{policy:<34}{m['arguments']:>10.2f}{m['outputs']:>10.2f}"
          f"{m['aliased']:>10.2f}{m['temporaries']:>10.2f}{m['total']:>11.2f}"
          f"{m['total'] / first_total:>10.2f}{m['compile_s']:>11.1f}",
          flush=True)
  if jax.default_backend() == 'cpu':
    print("note: XLA's CPU scheduler does not place recomputation late, so "
          'remat policies barely change CPU figures; measure on a GPU.')


if __name__ == '__main__':
  main()
