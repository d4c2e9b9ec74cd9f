"""What the live view and /metrics cost the measurement server, side by side.

Starts a server in its own process (as `fecomlite run` does) with this machine's sensors, records
a run that watches a live child process while a thread posts probe batches like a training loop
(EVENTS_PER_S calls of 8 APIs), and measures the server's CPU time over wall time in three
phases: nobody watching; one live viewer (the SSE stream, 2.5 messages a second); a viewer plus
a Prometheus scrape every second. Also the size of a stream message and of a scrape.

    python benchmarks/live_overhead.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

import _results
import psutil

from fecomlite.runtime import batch_codec
from fecomlite.server.client import ServerClient, ensure_server

EVENTS_PER_S = 5000
BATCH_S = 0.2  # the probe's flush interval
APIS = [f"torch.op{i}" for i in range(8)]


def cpu_share(proc: psutil.Process, seconds: float) -> float:
    before, t0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, t1 = proc.cpu_times(), time.monotonic()
    return ((after.user - before.user) + (after.system - before.system)) / (t1 - t0)


def post_events(client: ServerClient, run: int, token: str, stop: threading.Event) -> None:
    """A training loop's batches: EVENTS_PER_S back-to-back calls, sent every BATCH_S, each
    with the call in progress (`open`) that the probe reports."""
    n = int(EVENTS_PER_S * BATCH_S)
    for seq in itertools.count():
        if stop.wait(BATCH_S):
            return
        now = time.monotonic_ns()
        step = int(BATCH_S * 1e9) // n
        t0 = [now - int(BATCH_S * 1e9) + i * step for i in range(n)]
        columns = (array("i", [i % len(APIS) for i in range(n)]).tobytes(),
                   array("q", t0).tobytes(), array("q", [t + step // 2 for t in t0]).tobytes(),
                   array("Q", [1] * n).tobytes(), bytes(n), array("q", [-1] * n).tobytes(),
                   array("q", [-1] * n).tobytes())
        running = [{"tid": 1, "depth": 1, "calls": [[APIS[seq % len(APIS)], now]]}]
        header = {"rep": 1, "pid": 1, "proc": "bench", "seq": seq, "open": running}
        client.post_batch(run, token, batch_codec.encode(header, APIS, columns))


def view(port: int, token: str, stop: threading.Event, sizes: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", f"/live/stream?token={token}")
    response = conn.getresponse()
    while not stop.is_set():
        line = response.fp.readline()
        if line.startswith(b"data: "):
            sizes.append(len(line))
    conn.close()


def scrape(port: int, token: str, stop: threading.Event, sizes: list[int]) -> None:
    while not stop.wait(1.0):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", f"/metrics?token={token}")
        sizes.append(len(conn.getresponse().read()))
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    _results.add_option(parser, "live_overhead")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="fecomlite-bench-"))
    client = ensure_server(home)
    server = psutil.Process(client.pid)
    port = int(client.url.rsplit(":", 1)[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    stops = [threading.Event() for _ in range(3)]
    streamed: list[int] = []
    scraped: list[int] = []
    try:
        run, token = client.create_run("bench", [], "method", {}, kind="calibration",
                                       manifest={a: {"api": a} for a in APIS})
        client.watch(run, child.pid)
        threading.Thread(target=post_events, args=(client, run, token, stops[0]),
                         daemon=True).start()
        time.sleep(1.0)
        alone = cpu_share(server, args.seconds)
        threading.Thread(target=view, args=(port, client.view_token, stops[1], streamed),
                         daemon=True).start()
        time.sleep(1.0)
        viewed = cpu_share(server, args.seconds)
        threading.Thread(target=scrape, args=(port, client.view_token, stops[2], scraped),
                         daemon=True).start()
        time.sleep(1.0)
        scraping = cpu_share(server, args.seconds)
        for stop in stops:
            stop.set()
        client.finish_run(run, "finished", 0)
    finally:
        for stop in stops:
            stop.set()
        child.kill()
        client.shutdown()

    print(f"recording a run: {EVENTS_PER_S} calls/s of {len(APIS)} APIs, a watched process")
    print(f"{'phase':34s} {'server CPU':>11s} {'vs nobody watching':>19s}")
    for phase, share in (("nobody watching", alone), ("one live viewer", viewed),
                         ("viewer + scrape every second", scraping)):
        print(f"{phase:34s} {share * 100:9.2f} % {share / alone:18.2f}x")
    if streamed:
        print(f"stream: {len(streamed)} messages, {sum(streamed) / len(streamed) / 1e3:.1f} kB "
              "each on average (the first carries the history)")
    if scraped:
        print(f"scrape: {scraped[-1] / 1e3:.1f} kB")
    _results.write(args.json, "live_overhead", {
        "seconds": args.seconds, "events_per_s": EVENTS_PER_S,
        "server_cpu_share": {"nobody watching": alone, "one live viewer": viewed,
                             "viewer + scrape every second": scraping},
        "stream_message_bytes_mean": sum(streamed) / len(streamed) if streamed else None,
        "scrape_bytes": scraped[-1] if scraped else None})


if __name__ == "__main__":
    main()
