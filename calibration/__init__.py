"""Fitting the simulator's step times to the real engine, and measuring how close the simulator comes (README.md)."""
