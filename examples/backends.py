#!/usr/bin/env python3
"""Bookinfo's workloads as tiny HTTP servers on 127.0.0.1, for the README walk-through.

Each answers every request with JSON naming itself, so you can see which backend the
mesh routed to. Ports match examples/bookinfo/*.yaml.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BACKENDS = {
    "productpage-v1": 19080,
    "details-v1": 19081,
    "reviews-v1": 19082,
    "reviews-v2": 19083,
    "reviews-v3": 19084,
    "ratings-v1": 19085,
}


def handler_for(name):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"backend": name, "path": self.path, "host": self.headers.get("Host")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            body += b"\n"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    return Handler


if __name__ == "__main__":
    servers = [ThreadingHTTPServer(("127.0.0.1", port), handler_for(name)) for name, port in BACKENDS.items()]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("backends:", ", ".join(f"{n}=127.0.0.1:{p}" for n, p in BACKENDS.items()), flush=True)
    threading.Event().wait()
