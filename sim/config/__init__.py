"""Scenario files and their schema: every section a scenario may have, validated at the boundary, and the error every
input check raises. Depends on nothing else in sim but hardware presets' names.
"""
