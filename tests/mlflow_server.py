"""A real `mlflow server` on 127.0.0.1 for tests: started in its own process group, stopped as one."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def unavailable_server():
    """The URI of something on 127.0.0.1 that answers every request with 503 (a proxy whose MLflow
    behind it is down): the tracking preflight, which only connects, passes; MLflow's calls fail."""

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"<html>\n<body>503 Service Unavailable</body>\n</html>\n")

        do_GET = do_POST = do_PATCH = do_DELETE = answer

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()


def start_server(folder: Path, port: int, timeout: float = 120) -> subprocess.Popen:
    """Start a server whose store (``server.db``, ``artifacts/``) lives in ``folder``: starting it
    again on the same folder and port brings back the same store. Its output goes to
    ``folder/mlflow-server.log``, quoted if it does not come up."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    log_path = folder / "mlflow-server.log"
    with log_path.open("a") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{folder / 'server.db'}",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # setsid: the server and its workers form one process group
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            pytest.fail(f"mlflow server did not come up:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen, graceful: bool = True) -> None:
    """Stop the server's process group: SIGTERM first when ``graceful``, SIGKILL otherwise (a
    server that goes away abruptly) or when SIGTERM is not enough."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 30))[0 if graceful else 1 :]:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=30)
