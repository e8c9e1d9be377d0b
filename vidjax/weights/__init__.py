"""Weights in: released checkpoints read exactly and fitted to the live model."""
