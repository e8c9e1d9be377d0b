"""Evaluation: eval sets, the field's benchmarks, the text-prompt classifier."""
