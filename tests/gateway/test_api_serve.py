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
    assert proc.returncode == 0, out  # a stop asked for (143 read as a failure to systemd)
    assert not KEY.findall(out)  # shown once
    assert (tmp_path / "dev.db").exists() and (tmp_path / "redis").is_dir()
    # the tenant and key it made are in the audit log, as every other change is (found by QA)
    import sqlite3

    with sqlite3.connect(tmp_path / "dev.db") as conn:
        rows = conn.execute("SELECT actor, action, target FROM audit_log ORDER BY id").fetchall()
    assert rows == [("pagegate serve --dev", "tenant.create", "tenant:default"),
                    ("pagegate serve --dev", "key.create", f"key:{keys[0][:10]}")]


async def test_access_log_setting_reaches_uvicorn(tmp_path, capfd) -> None:  # noqa: ANN001
    """``PAGEGATE_ACCESS_LOG`` (on by default) is what ``pagegate serve`` gives uvicorn: one
    access line per request when on, none when off (the usage rows remain)."""
    import logging

    from gateway.settings import Settings

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    assert Settings.model_fields["access_log"].default is True
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level) for lg in loggers]
    seen = {}
    try:
        await _serve_once_each(app, tmp_path, capfd, seen)
    finally:  # uvicorn's logging config points at this test's captured stdout: undo it
        for lg, handlers, propagate, level in saved:
            lg.handlers[:] = handlers
            lg.propagate = propagate
            lg.setLevel(level)
    assert len(seen[True]) == 1 and seen[False] == []


async def _serve_once_each(app, tmp_path, capfd, seen: dict) -> None:  # noqa: ANN001
    import asyncio

    import uvicorn

    from gateway.serve import uvicorn_options
    from gateway.settings import Settings

    for access_log in (True, False):
        settings = Settings(port=free_port(), log_level="info", access_log=access_log, data_dir=str(tmp_path))
        capfd.readouterr()
        server = uvicorn.Server(uvicorn.Config(app, lifespan="off", **uvicorn_options(settings)))
        task = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                assert not task.done()
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"http://127.0.0.1:{settings.port}/x")).status_code == 204
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)
        out, err = capfd.readouterr()
        seen[access_log] = [line for line in (out + err).splitlines() if '"GET /x HTTP/1.1" 204' in line]


def test_an_unusable_database_is_one_line_and_exit_1(tmp_path) -> None:  # noqa: ANN001
    """PostgreSQL down (nothing listens on the port) at start: one line naming the database with
    its password hidden, no traceback, exit status 1; the embedded Redis is stopped again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEGATE_")}
    env.update(PAGEGATE_DATABASE_URL=f"postgresql+asyncpg://app:secret@127.0.0.1:{free_port()}/nowhere",
               PAGEGATE_DATA_DIR=str(tmp_path), PAGEGATE_LOAD_ENGINE="false", PAGEGATE_CACHE_ENABLED="false",
               PAGEGATE_LOG_LEVEL="warning", PAGEGATE_DATABASE_TIMEOUT_S="2")
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "app:***@127.0.0.1" in lines[0] and "secret" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_lost_embedded_redis_stops_the_server_with_status_1(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: with the embedded Redis killed, every request was a 503 for good while /health
    said ok; the server now stops (status 1) so a process manager, or the user, starts it again."""
    import json

    from gateway.redis_server import _running

    port = free_port()
    proc = _start(tmp_path, port)
    try:
        _wait_healthy(proc, port)
        registry = json.loads((tmp_path / "redis" / "pagegate.rdb.settings").read_text())
        pid = int(Path(registry["pidfile"]).read_text().strip())
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            _stop(proc)
    assert proc.returncode == 1, out
    assert "the embedded Redis stopped" in out
    assert not _running(pid)
