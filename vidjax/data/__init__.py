"""vidjax.data."""
