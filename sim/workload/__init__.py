"""Where requests come from: synthetic arrivals and lengths, the shipped real traces (data/traces) and users' own
traces.
"""
