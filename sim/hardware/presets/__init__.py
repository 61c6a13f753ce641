"""Model and GPU presets beyond the few in sim/hardware/specs.py, each with its source in a comment."""
