"""``pagegate serve --dev`` as a user runs it (``make run``): a subprocess with no Redis URL (so an
embedded Redis is started), a fresh SQLite file (schema upgraded on start), a dev key printed
once, and the API answering with it. The engine is switched off to keep this test light."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

KEY = re.compile(r"\bpg-[0-9A-Za-z]{43}\b")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEGATE_")}
    env.update(PAGEGATE_DATABASE_URL=f"sqlite+aiosqlite:///{tmp / 'dev.db'}", PAGEGATE_DATA_DIR=str(tmp),
               PAGEGATE_USAGE_SPOOL_DIR=str(tmp / "spool"), PAGEGATE_LOAD_ENGINE="false",
               PAGEGATE_CACHE_ENABLED="false", PAGEGATE_LOG_LEVEL="warning")
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--dev", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=Path(__file__).resolve().parents[2])


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("pagegate serve did not become healthy")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_serve_dev_bootstraps_an_empty_database(tmp_path) -> None:  # noqa: ANN001
    port = free_port()
    proc = _start(tmp_path, port)
    banner = []
    try:
        for line in proc.stdout:  # the banner is printed (flushed) before uvicorn starts
            banner.append(line)
            if "print(reply.choices[0].message.content)" in line:
                break
        text = "".join(banner)
        keys = KEY.findall(text)
        assert len(set(keys)) == 1, text
        assert "curl http://127.0.0.1:" in text and "OpenAI(base_url=" in text
        _wait_healthy(proc, port)
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url, timeout=10).status_code == 401
        resp = httpx.get(url, headers={"authorization": f"Bearer {keys[0]}"}, timeout=10)
        assert resp.status_code == 200, resp.text
        assert [m["id"] for m in resp.json()["data"]] == ["all-MiniLM-L6-v2"]  # no engine in this process
    finally:
        out = _stop(proc)
    assert not KEY.findall(out)  # shown once
    assert (tmp_path / "dev.db").exists() and (tmp_path / "redis").is_dir()
