"""The Dash page of ``servesim teach``: knobs on the left, the run's charts on the right.

State lives in the browser only: the knob controls themselves, the preset's fixed fields (``dcc.Store`` "base")
and the pinned run's knob set (``dcc.Store`` "pinned"). The server keeps nothing between callbacks, so students
sharing one server never move each other's knobs. Every asset (dash's scripts, plotly.js) is served by this
server (``serve_locally``): the page works with no network.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, State, ctx, dcc, html
from waitress import create_server

from sim.config.schema import ScenarioError
from sim.hardware.gpu import GPU_PRESETS
from sim.metrics.summary import bottleneck
from sim.studies.teach.explain import compare, explain
from sim.studies.teach.figures import NARROW_PX, fig_latency_cdfs_page, fig_memories, fig_slots, fig_utilisation
from sim.studies.teach.knobs import (
    DEFAULT_PRESET,
    KV_TYPES,
    POLICIES,
    TEACH_REQUESTS,
    UI_KEYS,
    UI_KNOBS,
    Knobs,
    preset,
    preset_names,
    simulate,
)

CHOICES: dict[str, dict[str, str]] = {"policy": POLICIES, "kv": KV_TYPES}
FIGURES = ("slots", "memory", "utilisation", "cdfs")
LABEL_STYLE = {"fontSize": "0.85em", "marginTop": "0.5em", "display": "block"}


# Requests the server handles at once. A redraw is CPU-bound Python (one simulates at a time under the GIL), but
# with spare threads the page's scripts and another student's first load are not queued behind redraws.
SERVER_THREADS = 8

# requests/s: min, max, step of the arrival-rate slider (every lesson's rate lies inside). Its value shows in dash
# 4's number box beside the slider, which dash hides in a container 300 px wide or less: hence CONTROLS_WIDTH. (An
# always-visible tooltip above the handle covered the slider's label.)
RATE_SLIDER = (0.05, 20.0, 0.05)
CONTROLS_WIDTH = "320px"


def _control(key: str, label: str, value: Any) -> html.Div:
    if key == "rate":
        lo, hi, step = RATE_SLIDER
        slider = dcc.Slider(id=key, min=lo, max=hi, step=step, value=min(max(value, lo), hi),
                            marks={v: str(v) for v in (1, 5, 10, 15, 20)}, updatemode="mouseup")
        return html.Div([html.Label(label, htmlFor=key, style=LABEL_STYLE), slider])
    if key in CHOICES:
        ctl: Any = dcc.RadioItems(id=key, options=[{"label": v, "value": k} for k, v in CHOICES[key].items()],
                                  value=value, labelStyle={"display": "block"})
    elif key == "gpu":
        ctl = dcc.Dropdown(id=key, options=list(GPU_PRESETS), value=value, clearable=False)
    else:
        # no min/max on the box: an out-of-range value must reach the scenario validation, which names the key
        # and the bound exactly as the CLI does (a browser-side bound would silently turn it into None). A
        # numeric debounce (sent on Enter or after a pause): dash 4.4's debounce=True never sends a value equal
        # to the last one it sent, so retyping a value after a preset had changed it did nothing.
        ctl = dcc.Input(id=key, type="number", value=value, debounce=0.8, style={"width": "8em"})
    return html.Div([html.Label(label, htmlFor=key, style=LABEL_STYLE), ctl])


def layout() -> html.Div:
    start = preset(DEFAULT_PRESET)
    controls = [
        html.Label("lesson preset", htmlFor="preset", style=LABEL_STYLE),
        dcc.Dropdown(id="preset", options=preset_names(), value=DEFAULT_PRESET, clearable=False),
        *[_control(key, label, start[key]) for key, label in UI_KNOBS],
        html.Div(
            [html.Button("pin this run", id="pin", n_clicks=0), html.Button("unpin", id="unpin", n_clicks=0)],
            style={"marginTop": "1em", "display": "flex", "gap": "0.5em"},
        ),
        html.Div(id="pinned-label", style={"fontSize": "0.85em", "marginTop": "0.5em"}),
    ]
    graphs = [dcc.Graph(id=f"fig-{name}", config={"displaylogo": False}) for name in FIGURES]
    return html.Div(
        [
            dcc.Store(id="base", data=start),
            dcc.Store(id="pinned", data=None),
            dcc.Store(id="narrow", data=None),  # whether the window is narrow (a phone): set in the browser
            # the knobs beside the charts on a wide screen, above them on a phone (the row wraps)
            html.Div(controls, style={"flex": f"0 1 {CONTROLS_WIDTH}", "padding": "0 1em"}),
            html.Div(
                [
                    html.H2("servesim teach: move a knob, watch the batch, the memory and the latency"),
                    html.Div(id="error", role="alert",
                             style={"color": "#b00020", "fontWeight": "bold", "whiteSpace": "pre-wrap"}),
                    html.Div(id="throughput", style={"fontSize": "1.1em"}),
                    html.Div(id="pinned-throughput", style={"fontSize": "1.1em", "color": "#555"}),
                    html.Div(id="verdict", style={"marginTop": "0.5em"}),
                    html.Ul(id="explanation"),
                    *graphs,
                ],
                style={"flex": "1 1 340px", "minWidth": "0", "padding": "0 0.5em"},
            ),
        ],
        style={"display": "flex", "flexWrap": "wrap", "fontFamily": "sans-serif"},
    )


def _line(name: str, s: dict) -> str:
    # the summary's rates are over the whole run (first arrival to last completion), the verdict's over the arrival
    # window (sim.metrics.verdict says so): each line names its window, or a student reads two "requests/s" as one
    return (f"{name}: output throughput {s['output_throughput']:,.0f} tok/s, {s['request_throughput']:.3g} "
            f"requests/s over the whole run ({s['duration']:.3g} s, first arrival to last completion), "
            f"{s['num_completed']} of {s['num_requests']} completed, TTFT p99 {s['ttft']['p99']:.3g} s")


def _knobs(base: Knobs, values: tuple[Any, ...]) -> Knobs:
    return {**base, **dict(zip(UI_KEYS, values, strict=True))}


def redraw(knobs: Knobs, pinned: Knobs | None, narrow: bool = False) -> dict[str, Any]:
    """Everything the page shows for a knob set (and the pinned one): figures, texts. Raises ScenarioError."""
    current = {**knobs, "label": f"now: {POLICIES[knobs['policy']] if knobs['policy'] in POLICIES else '?'}"}
    runs = [simulate(current)]
    if pinned is not None:
        runs.insert(0, simulate({**pinned, "label": f"pinned: {POLICIES.get(pinned['policy'], '?')}"}))
    results = [r.results[0] for r in runs]
    summaries = {r.results[0].name: next(iter(r.summaries.values())) for r in runs}
    now_name, now = results[-1].name, summaries[results[-1].name]
    texts = [html.Li(t) for t in explain(now, offered_rate=float(knobs["rate"]))]
    pinned_text = ""
    if pinned is not None:
        pinned_name = results[0].name
        pinned_text = _line(pinned_name, summaries[pinned_name])
        texts.append(html.Li(compare(summaries[pinned_name], now)))
    return {
        "throughput": _line(now_name, now),
        "pinned-throughput": pinned_text,
        "verdict": f"bottleneck ({now_name}): {bottleneck(now)}",
        "explanation": texts,
        "slots": fig_slots(results, narrow),
        "memory": fig_memories(results, narrow),
        "utilisation": fig_utilisation(summaries, narrow),
        "cdfs": fig_latency_cdfs_page(results, narrow),
    }


def create_app() -> Dash:
    """A new page with its callbacks; nothing is shared between two browsers but this code."""
    app = Dash(__name__, serve_locally=True, title="servesim teach", assets_folder="no-assets",
               update_title="")
    app.layout = layout

    @app.callback([Output("base", "data")] + [Output(k, "value") for k in UI_KEYS],
                  Input("preset", "value"), prevent_initial_call=True)
    def load_preset(name: str) -> list[Any]:
        k = preset(name)
        return [k] + [k[key] for key in UI_KEYS]

    @app.callback(Output("pinned", "data"), Output("pinned-label", "children"),
                  Input("pin", "n_clicks"), Input("unpin", "n_clicks"),
                  State("base", "data"), *[State(k, "value") for k in UI_KEYS], prevent_initial_call=True)
    def pin(_pin: int, _unpin: int, base: Knobs, *values: Any) -> tuple[Any, str]:
        if ctx.triggered_id == "unpin":
            return None, ""
        k = _knobs(base, values)
        return k, (f"pinned: {POLICIES.get(k['policy'], k['policy'])}, arrival rate {k['rate']} requests/s "
                   f"({k['name']})")

    # the window's width, read once when the page loads: the figures stack their panels on a phone
    app.clientside_callback(f"function(_) {{ return window.innerWidth < {NARROW_PX}; }}",
                            Output("narrow", "data"), Input("base", "id"))

    outputs = ["error", "throughput", "pinned-throughput", "verdict", "explanation"]

    @app.callback([Output(o, "children") for o in outputs] + [Output(f"fig-{f}", "figure") for f in FIGURES],
                  Input("base", "data"), Input("pinned", "data"), Input("narrow", "data"),
                  *[Input(k, "value") for k in UI_KEYS])
    def update(base: Knobs, pinned: Knobs | None, narrow: bool | None, *values: Any) -> list[Any]:
        try:
            shown = redraw(_knobs(base, values), pinned, bool(narrow))
        except ScenarioError as e:
            # the CLI's message, word for word; the charts keep showing the last good run
            return [str(e)] + [dash.no_update] * (len(outputs) - 1 + len(FIGURES))
        return [""] + [shown[o] for o in outputs[1:]] + [shown[f] for f in FIGURES]

    return app


def serve(host: str = "127.0.0.1", port: int = 8050) -> None:
    """Serve the page with waitress, a production WSGI server, until interrupted (Flask's built-in server is for
    development and says so in red on every start, while ``--host 0.0.0.0`` serves a whole class)."""
    server = create_server(create_app().server, host=host, port=port, threads=SERVER_THREADS, ident="servesim teach")
    print(f"servesim teach: http://{host}:{port}/ ({TEACH_REQUESTS} requests per run)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C is how a teacher stops the page: no traceback
        pass
    finally:
        server.close()
