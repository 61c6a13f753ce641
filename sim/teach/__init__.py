"""The interactive teaching page (``servesim teach``): move a knob, watch the batch, the memory and the latency.

- :mod:`sim.teach.knobs`: knob values to a scenario dict, validated and run through the CLI's own code; the
  lesson presets. Needs no dash.
- :mod:`sim.teach.explain`: the short explanation text of a run, from its summary. Needs no dash.
- :mod:`sim.teach.figures`: the page's figures (the report's own laid out for the window's width, stacked on a
  phone, plus a compact utilisation panel).
- :mod:`sim.teach.app`: the Dash page and its callbacks (needs the ``teach`` extra).
"""
