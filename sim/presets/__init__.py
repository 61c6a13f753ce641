"""Model and GPU presets beyond the few in sim/specs.py, each with its source in a comment."""
