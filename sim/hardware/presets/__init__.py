"""Model and GPU presets, each with its source in a comment (sim/hardware/models.py and gpu.py make specs of them)."""
