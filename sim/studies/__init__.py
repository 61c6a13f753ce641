"""Many runs at once: sweeps, capacity planning, policy tournaments, evaluate() for policy search, and the teaching
page.
"""
