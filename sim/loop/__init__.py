"""What runs a scenario: assembling a variant's objects, the SimPy serving loop, clusters, autoscaling, disaggregated
pools, replay of measured steps, and observe (a live server instead of the simulator).
"""
