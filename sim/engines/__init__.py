"""Serving engines as servesim models them (deployment.engine): each engine's scheduler defaults and host costs."""
