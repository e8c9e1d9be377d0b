"""Checkpoints: the writer, the reader, resuming, checksums, failed saves."""
