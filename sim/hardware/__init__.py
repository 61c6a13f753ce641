"""What the hardware and the model are: GPU and model specifications and presets, the KV bytes a token takes, MLA, MoE
and sliding-window arithmetic.
"""
