"""vidjax.bench."""
