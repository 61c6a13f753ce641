"""Speed benchmark: does `servesim observe` keep up with the load it offers? Against a stub server that answers
at once (aiohttp, in a process of its own; each request streamed as ``--chunks`` text events and ``[DONE]``), the
client sends a Poisson stream at each ``--rates`` requests per second and reports, per rate: the rate it achieved
(requests sent over the span of their send times), how late each request left against its planned arrival (send
lag p50, p99, max), the client's own CPU seconds per request, and the TTFT and E2EL it measured (the stub adds
nothing, so they are the client's and the loopback's own latency: the floor under any measurement).

    python benchmarks/bench_observe.py [--rates 200,500] [--seconds 10] [--chunks 8]

Target (issue 39): at least 200 requests per second with the client never setting the measured latency.
Not part of the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket

import numpy as np

from sim.loop.observe import ObserveRun, client_overhead, observe_async
from sim.serving.request import RequestSpec


def _stub(port: int, chunks: int) -> None:
    from aiohttp import web

    event = b'data: {"choices": [{"index": 0, "text": " x"}]}\n\n'

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int) -> None:
    import time

    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the stub did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="200,500", help="offered loads, requests per second (comma-separated)")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each load's run")
    ap.add_argument("--chunks", type=int, default=8, help="text events per streamed reply")
    args = ap.parse_args()
    port = _free_port()
    proc = multiprocessing.Process(target=_stub, args=(port, args.chunks), daemon=True)
    proc.start()
    try:
        _wait_listening(port)
        print(f"stub: 127.0.0.1:{port}, {args.chunks} chunks a reply; {args.seconds:g} s per load")
        print("offered req/s  achieved req/s  completed  lag p50 ms  lag p99 ms  lag max ms  CPU/req ms  "
              "TTFT p50 ms  TTFT p99 ms  E2EL p50 ms")
        for rate in (float(r) for r in args.rates.split(",")):
            n = int(rate * args.seconds)
            rng = np.random.default_rng(0)
            arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
            specs = [RequestSpec(i, float(a), 16, args.chunks) for i, a in enumerate(arrivals)]
            run = ObserveRun(f"http://127.0.0.1:{port}/v1", "completions")
            asyncio.run(observe_async(run, specs, model="stub", scrape_interval=0))
            o = client_overhead(run)
            recs = list(run.results.values())
            sent = np.sort([r.sent for r in recs])
            done = [r for r in recs if r.success]
            ttft = np.array([r.ttft for r in done]) * 1e3
            e2el = np.array([r.latency for r in done]) * 1e3
            achieved = (len(sent) - 1) / (sent[-1] - sent[0])
            print(f"{rate:13.0f}  {achieved:14.1f}  {len(done):4d}/{n:<4d}  {o['send_lag_p50_s'] * 1e3:10.2f}  "
                  f"{o['send_lag_p99_s'] * 1e3:10.2f}  {o['send_lag_max_s'] * 1e3:10.2f}  "
                  f"{o['cpu_per_request_s'] * 1e3:10.3f}  {np.percentile(ttft, 50):11.2f}  "
                  f"{np.percentile(ttft, 99):11.2f}  {np.percentile(e2el, 50):11.2f}")
    finally:
        proc.terminate()
        proc.join()


if __name__ == "__main__":
    main()
