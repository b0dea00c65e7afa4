"""A gateway server in its own process, for the HTTP benchmarks: started with ``python -m
gateway.serve`` (or another command), ready once ``GET /health`` answers 200, its CPU read
from /proc, stopped with SIGTERM (then SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class GatewayProcess:
    def __init__(self, port: int, env: dict, log_path: Path, *, cmd: list[str] | None = None,
                 cwd: Path = ROOT, wait: bool = True, timeout_s: float = 300) -> None:
        self.port, self.log_path, self.timeout_s = port, Path(log_path), timeout_s
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = cmd or [sys.executable, "-m", "gateway.serve"]
        self.proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start in {self.timeout_s:.0f} s; see {self.log_path}")
            try:
                self.health()
                return
            except OSError:
                time.sleep(0.2)

    def health(self) -> dict:
        return self._get("/health")

    def metrics(self) -> dict:
        return self._get("/metrics")

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def cpu_s(self) -> tuple[float, float]:
        """(all threads, the main = event-loop thread) user + system CPU seconds so far."""
        tck = os.sysconf("SC_CLK_TCK")

        def read(path: str) -> float:
            fields = Path(path).read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tck

        pid = self.proc.pid
        return read(f"/proc/{pid}/stat"), read(f"/proc/{pid}/task/{pid}/stat")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
