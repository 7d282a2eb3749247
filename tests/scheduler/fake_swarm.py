"""A stand-in for the `swarm` CLI (serve / client) with the same flags, for scheduler tests.

    python fake_swarm.py serve --port 0 --out DIR [--max-steps N] ...   # N = seconds to live
    python fake_swarm.py client --url URL --seed S ...                  # checks the URL, then idles

`serve` binds 127.0.0.1:0, writes DIR/server.json like `swarm serve`, answers
GET /swarm/v1/status (200 with the right Bearer token from ROOST_TOKEN, else 401), and
exits 0 after `--max-steps` seconds or on SIGTERM. `client` prints what it got, asks
the server once (failing if it cannot), then sleeps until stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = os.environ.get("ROOST_TOKEN", "")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        ok = self.path == "/swarm/v1/status" and self.headers.get("Authorization") == f"Bearer {TOKEN}"
        body = json.dumps({"step": 0} if ok else {"detail": "unauthorized"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--max-steps", type=float, default=3600)
    args, _ = ap.parse_known_args(argv)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    url = f"http://{args.host}:{httpd.server_address[1]}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "server.json").write_text(json.dumps({"url": url, "pid": os.getpid()}))
    print(f"fake server on {url} argv={argv}", flush=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait(args.max_steps)
    httpd.shutdown()
    return 0


def client(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--seed", required=True)
    args, _ = ap.parse_known_args(argv)
    req = urllib.request.Request(f"{args.url}/swarm/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        print(f"client seed={args.seed} url={args.url} status={r.status} argv={argv}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    sys.exit(serve(rest) if mode == "serve" else client(rest))
