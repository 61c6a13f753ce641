"""servesim: a discrete-event simulator of LLM inference serving. The serving core imports without torch."""

__version__ = "0.1.0"
