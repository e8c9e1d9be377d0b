"""vidjax.models."""
