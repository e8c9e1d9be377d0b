"""Ground floor: errors, private APIs, whole files, the run directory, stopping."""
