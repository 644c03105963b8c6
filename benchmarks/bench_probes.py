"""Probes under a connection flood: does the kubelet still get its answer?

A real ``avatar-release serve`` process on a real build (a tiny cpu-8 build compiled into a
temporary registry unless ``--registry`` is given). One flooder holds ``--connections`` (500) slow
connections from one address (127.0.0.2: Linux routes all of 127/8 to loopback, so the pod sees
another client), sending a header line every second and never finishing a request, and reopens
any the pod closes. Meanwhile the "kubelet" (127.0.0.1) asks ``/livez`` every 50 ms for
``--seconds`` (10): latency p50/p99/max and failures (an error, a timeout of 1 s, or not 200).

Two pods side by side in one run:
  * ``shared``: the behaviour before issue 26: probes on the render port only, no per-client cap
    (``--probe-port -1 --max-connections-per-client 0``), the flood on the render port;
  * ``own``: the defaults: the flood on the render port *and* on the probe port, ``/livez`` asked
    on the probe port (what deploy/ points the kubelet at), and on the render port too.

Goal (issue 26): on the probe port, p99 < 100 ms and no failures.

    python benchmarks/bench_probes.py [--registry DIR] [--connections 500] [--out benchmarks/results/probes.json]
    python benchmarks/bench_probes.py --smoke --registry DIR      # 100 connections, seconds; the tests run it
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

FLOOD_FROM = "127.0.0.2"


def _pod(registry: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "serve",
            "--registry",
            registry,
            "--channel",
            "dev",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("the pod did not start")
    return proc, json.loads(line)


class Flooder:
    """``n`` slow connections per port from one address, kept open (reopened at once when the pod
    closes one). Runs in a process of its own (``--flood-worker``), so its loop never competes with
    the probing client for a GIL: what is measured is the pod."""

    def __init__(self, ports: list[int], n: int) -> None:
        self.ports, self.n = ports, n
        self.stop = threading.Event()
        self.opened = self.closed_by_pod = 0
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Flooder:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--flood-worker", ",".join(map(str, self.ports)), str(self.n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.proc.stdout.readline()  # "flooding": every connection opened
        time.sleep(1.0)  # let the flood build up
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        stats = json.loads(out.strip().splitlines()[-1])
        self.opened, self.closed_by_pod = stats["opened"], stats["closed_by_pod"]


class _FloodWorker:
    def __init__(self, ports: list[int], n: int) -> None:
        self.ports, self.n = ports, n
        self.stop = threading.Event()
        self.opened = self.closed_by_pod = 0

    def _connect(self, sel, port: int) -> None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((FLOOD_FROM, 0))
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            return
        sel.register(s, selectors.EVENT_READ, port)
        self.opened += 1

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for port in self.ports:
            for _ in range(self.n):
                self._connect(sel, port)
        print("flooding", flush=True)
        last = 0.0
        while not self.stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:  # the pod closed it (cap, header timeout): open another
                    sel.unregister(s)
                    s.close()
                    self.closed_by_pod += 1
                    self._connect(sel, key.data)
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                for key in list(sel.get_map().values()):
                    try:
                        key.fileobj.send(b"GET /livez HTTP/1.1\r\nX-Slow: 1\r\n")  # never the blank line
                    except OSError:
                        pass
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        print(json.dumps({"opened": self.opened, "closed_by_pod": self.closed_by_pod}), flush=True)


def _flood_worker(ports: str, n: str) -> None:
    w = _FloodWorker([int(p) for p in ports.split(",")], int(n))
    threading.Thread(target=lambda: (sys.stdin.readline(), w.stop.set()), daemon=True).start()
    w.run()


def _probe_for(port: int, seconds: float) -> dict:
    lat, failures, reasons = [], 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
            c.request("GET", "/livez")
            r = c.getresponse()
            r.read()
            c.close()
            ok, why = r.status == 200, f"HTTP {r.status}"
        except (OSError, http.client.HTTPException) as e:
            ok, why = False, type(e).__name__
        dt = time.perf_counter() - t0
        if ok:
            lat.append(dt)
        else:
            failures += 1
            reasons[why] = reasons.get(why, 0) + 1
        time.sleep(max(0.0, 0.05 - dt))
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {
        "probes": len(lat) + failures,
        "failures": failures,
        "failure_kinds": reasons,
        "p50_ms": round(statistics.median(lat) * 1e3, 2) if lat else None,
        "p99_ms": round(q[98] * 1e3, 2) if lat else None,
        "max_ms": round(max(lat) * 1e3, 2) if lat else None,
    }


def _case(registry: str, connections: int, seconds: float, own: bool) -> dict:
    extra = [] if own else ["--probe-port", "-1", "--max-connections-per-client", "0"]
    proc, ready = _pod(registry, *extra)
    try:
        port, probe_port = ready["port"], ready.get("probe_port")
        flood_ports = [port, probe_port] if own else [port]
        with Flooder(flood_ports, connections) as f:
            out = {"render_port": _probe_for(port, seconds / (2 if own else 1))}
            if own:
                out["probe_port"] = _probe_for(probe_port, seconds / 2)
        out["flood"] = {
            "ports": len(flood_ports),
            "connections_per_port": connections,
            "opened": f.opened,
            "closed_by_pod": f.closed_by_pod,
        }
        return out
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", help="a registry whose dev channel holds a build (default: compile one)")
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="100 connections (past the 64 a pod admits), 2 s: proves the benchmark runs",
    )
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.connections, args.seconds = 100, 2.0
    registry = args.registry
    if registry is None:  # compiled as a user would, by the CLI (this process never starts JAX)
        registry = str(Path(tempfile.mkdtemp(prefix="bench-probes-")) / "reg")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "avatar_release",
                "compile",
                "--pipeline",
                "tiny",
                "--target",
                "cpu-8",
                "--registry",
                registry,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )
    shared = _case(registry, args.connections, args.seconds, own=False)
    own = _case(registry, args.connections, args.seconds, own=True)
    p = own["probe_port"]
    doc = {
        "benchmark": "probes-under-flood",
        "connections": args.connections,
        "seconds": args.seconds,
        "smoke": args.smoke,
        "cores": os.cpu_count(),
        "shared": shared,
        "own": own,
        "goal": {"probe_port_p99_ms_below": 100, "probe_port_failures": 0},
        "met": p["failures"] == 0 and p["p99_ms"] is not None and p["p99_ms"] < 100,
    }
    return write_results(doc, out_path(args.out, None, smoke=args.smoke), smoke=args.smoke, echo=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood-worker"]:
        _flood_worker(*sys.argv[2:4])
    else:
        main()
