"""The interactive teaching page (``servesim teach``): move a knob, watch the batch, the memory and the latency.

- :mod:`sim.studies.teach.knobs`: knob values to a scenario dict, validated and run through the CLI's own code; the
  lesson presets. Needs no dash.
- :mod:`sim.studies.teach.explain`: the short explanation text of a run, from its summary. Needs no dash.
- :mod:`sim.studies.teach.figures`: the page's figures (the report's own laid out for the window's width, stacked on a
  phone, plus a compact utilisation panel).
- :mod:`sim.studies.teach.app`: the Dash page and its callbacks (needs the ``teach`` extra).
"""
