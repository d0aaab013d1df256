# SPDX-License-Identifier: MIT
"""A real redis-server the Python tests start themselves on a free loopback port, in a temp
dir, no persistence; killed at the fixture's end. Skips the test when redis-server is not on
PATH (.ci/run installs it). Used by tools/python/tests and tools/integrations/tests."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server not on PATH")
        self.dir = tempfile.mkdtemp(prefix="kvt-redis-")
        for _ in range(5):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--maxmemory", "256mb",
                 "--maxmemory-policy", "allkeys-lru"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _ping(self.port):
                    return
                time.sleep(0.02)
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("redis-server did not start")

    def command(self, *args):
        """One command through redis-cli; its output (stripped)."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), *map(str, args)],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_server():
    s = RedisServer()
    try:
        yield s
    finally:
        s.close()
