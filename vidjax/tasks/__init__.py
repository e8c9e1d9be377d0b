"""vidjax.tasks."""
