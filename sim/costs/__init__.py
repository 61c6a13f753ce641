"""How long a step takes and what it costs: the analytic cost model, the online-serving layer and power and energy."""
