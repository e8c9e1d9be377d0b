"""vidjax: train large video models on a single machine, fast (JAX/Flax)."""

__version__ = "0.1.0"
