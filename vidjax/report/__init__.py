"""What a run reports: the console, metrics files, TensorBoard events, plots."""
