"""Helpers of the web-app tests: start the real `evalkit serve` on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ADMIN_PASSWORD = "s3cret-admin"
COMPLETION_CODE = "THANKS-7Q"
ARTIFACTS = Path(os.environ.get("EVALKIT_TEST_ARTIFACTS") or "build/test-artifacts").resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``evalkit serve`` as a real process on 127.0.0.1; ``stop()`` ends it (the tests do).
    ``env``: extra environment variables (the server's limits, ``EVALKIT_SERVE_*``);
    ``banner``: the line it printed on start."""

    def __init__(self, db, port=None, env=None, wrap=None):
        self.db, self.port = str(db), port or free_port()
        self.wrap = wrap or (lambda argv: argv)  # e.g. evalkit.testing.disks.command
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.env = dict(env or {})
        self.banner = ""

    def start(self, timeout=120):
        env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", **self.env)
        self.proc = subprocess.Popen(
            self.wrap(
                [
                    sys.executable,
                    "-m",
                    "evalkit",
                    "serve",
                    "--db",
                    self.db,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--admin-password",
                    ADMIN_PASSWORD,
                    "--completion-code",
                    COMPLETION_CODE,
                ]
            ),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    self.banner = self.proc.stdout.readline()  # printed before listening
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not start in time")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
