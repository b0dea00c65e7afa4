"""A gateway server in its own process, for the HTTP benchmarks: started with ``python -m
gateway.serve`` (or another command), ready once ``GET /health`` answers 200, its CPU read
from /proc, stopped with SIGTERM (then SIGKILL). A benchmark that exits, or is stopped by SIGTERM
(``timeout``), stops its servers; one killed outright (SIGKILL, the OOM killer) takes them with
it too: each is started with the kernel's parent-death signal (``gateway.workers.with_parent_death``),
so start servers from the thread that lives as long as the benchmark (its main thread)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from gateway.workers import with_parent_death

ROOT = Path(__file__).resolve().parents[1]

_running: list[GatewayProcess] = []  # started and not yet stopped
_watching = False  # _watch_exit has run


def _stop_all() -> None:
    for server in list(_running):
        server.stop()


def _exit_on_sigterm(signum: int, _frame) -> None:  # noqa: ANN001
    raise SystemExit(128 + signum)


def _watch_exit() -> None:
    """Once per process, from the main thread: stop the servers at exit, SIGTERM included."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    _watching = True
    atexit.register(_stop_all)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


class GatewayProcess:
    def __init__(self, port: int, env: dict, log_path: Path, *, cmd: list[str] | None = None,
                 cwd: Path = ROOT, wait: bool = True, timeout_s: float = 300) -> None:
        self.port, self.log_path, self.timeout_s = port, Path(log_path), timeout_s
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = cmd or [sys.executable, "-m", "gateway.serve"]
        _watch_exit()
        self.proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=with_parent_death())
        _running.append(self)
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
        """(all threads, the main = event-loop threads) user + system CPU seconds so far, of the
        server process and its children (``--workers``: the engine process and the workers)."""
        tck = os.sysconf("SC_CLK_TCK")

        def fields(path: str) -> list[str]:
            return Path(path).read_text().rsplit(")", 1)[1].split()

        def cpu(f: list[str]) -> float:
            return (int(f[11]) + int(f[12])) / tck

        pids, parents = [self.proc.pid], {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parents[int(entry.name)] = int(fields(f"/proc/{entry.name}/stat")[1])
                except (OSError, IndexError, ValueError):
                    pass
        for pid in pids:  # breadth-first over the tree
            pids += [child for child, parent in parents.items() if parent == pid]
        total = loop = 0.0
        for pid in pids:
            try:
                total += cpu(fields(f"/proc/{pid}/stat"))
                loop += cpu(fields(f"/proc/{pid}/task/{pid}/stat"))
            except OSError:  # exited meanwhile
                pass
        return total, loop

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the server and its children
                self.proc.wait()
        if self in _running:  # only now: a SIGTERM while it stops leaves it to the atexit
            _running.remove(self)
        self.log.close()
