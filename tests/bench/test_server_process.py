"""``bench.server_process``: a benchmark's servers do not outlive it, however it ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a benchmark that starts one "server" (a sleeper that takes --port), prints its pid and waits
BENCH = """
import sys, time
from pathlib import Path
from bench.server_process import GatewayProcess
server = GatewayProcess(0, {}, Path(sys.argv[1]), cmd=[sys.executable, "-c", "import time; time.sleep(60)"],
                        wait=False)
print(server.proc.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its new parent is gone too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_servers_end_with_their_benchmark(tmp_path: Path, how: signal.Signals) -> None:
    bench = subprocess.Popen([sys.executable, "-c", BENCH, str(tmp_path / "server.log")], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        server = int(bench.stdout.readline())
        assert _alive(server)
        bench.send_signal(how)
        bench.wait(10)
        deadline = time.monotonic() + 10
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server), f"the server outlived a benchmark stopped by {how.name}"
    finally:
        bench.kill()
        bench.wait()
