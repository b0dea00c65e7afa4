"""``pagegate serve --workers N`` (N > 1): one engine process, N HTTP workers in front of it.

    pagegate serve (supervisor: Redis, schema, dev key; starts, watches and stops the others)
      ├─ engine process   AsyncEngine + engine.ipc.EngineServer on <private dir>/engine.sock
      ├─ worker 1         uvicorn + the app; RemoteEngine → engine.sock; its own listening socket
      └─ worker N         (every worker's socket is bound to the same host:port with SO_REUSEPORT:
                           the kernel spreads the connections over them)

One event loop admits requests one after the other (the key, the limits, the quota, the usage
row, HTTP and JSON); with N workers a wave of requests is admitted on N cores, and the engine's
process does nothing else. Redis, the database and the usage spool are shared already (they are
how several gateway processes behave as one).

Faults: a worker that dies is started again (its socket is held here, so connections wait in
its queue meanwhile); more than ``MAX_RESTARTS`` in ``RESTART_WINDOW_S`` stops the service. The
engine process dying stops the service with exit status 1 (its workers answer 503 meanwhile):
the process manager restarts the whole. SIGTERM or SIGINT stops the workers first (each finishes
its requests, up to uvicorn's graceful timeout), then the engine. The children are in sessions of
their own (a terminal's Ctrl+C reaches only the supervisor, which stops them in that order) and
get SIGTERM if the supervisor itself is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from gateway.settings import Settings, python_log_level

log = logging.getLogger("pagegate.workers")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
ENGINE_START_TIMEOUT_S = 900.0  # loading (the first start converts the weights)
STOP_TIMEOUT_S = 20.0


def die_with_parent(parent: int, prctl: Callable[..., int] | None) -> None:
    """preexec_fn (in the child, before exec): SIGTERM when the parent dies (``prctl``: libc's,
    looked up in the parent by ``with_parent_death``: no ``dlopen`` between fork and exec). A
    parent that died between the fork and the ``prctl`` sends nothing: then the child has been
    handed to another parent already, and it exits at once instead of running as an orphan."""
    if prctl is not None:
        with contextlib.suppress(Exception):
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def with_parent_death() -> Callable[[], None]:
    """A ``preexec_fn`` for a child that must not outlive this process (``die_with_parent``). Call
    it from the thread that lives as long as the process: the kernel's signal follows the thread
    that forked."""
    prctl = None
    with contextlib.suppress(Exception):  # not Linux, or no libc to be found: only the orphan check
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    return functools.partial(die_with_parent, os.getpid(), prctl)


def probe_port(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    """Bind the address once without SO_REUSEPORT, so it fails (OSError) on any listener there, also
    another process's SO_REUSEPORT ones (another ``pagegate serve --workers`` of the same user would
    otherwise share the port and take part of the traffic). Returns the family and the address
    (port 0: the port the probe got)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(addr)
        return family, probe.getsockname()


def listeners(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` listening sockets on one address (SO_REUSEPORT). Raises OSError if the port is taken
    (``probe_port``)."""
    family, addr = probe_port(host, port)
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)
            addr = sock.getsockname()  # port 0: the others join the port the first one got
            sock.listen(2048)
            sock.set_inheritable(True)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.run_dir = Path(tempfile.mkdtemp(prefix="pagegate-"))  # 0700: only this user reaches the socket
        self.socket_path = str(self.run_dir / "engine.sock")
        # the children serve in the supervisor's mode (dev mode: the placeholder admin secret signs
        # tokens; found by QA, `--dev --workers 2` refused them); the dev tenant is made here, once
        self.env = {**os.environ, "PAGEGATE_REDIS_URL": settings.redis_url or "",
                    "PAGEGATE_DEV_MODE": "true" if settings.dev_mode else "false"}
        if settings.load_engine:  # PAGEGATE_LOAD_ENGINE=false: workers without an engine (admin, embeddings)
            self.env["PAGEGATE_ENGINE_SOCKET"] = self.socket_path
        metrics_dir = self.run_dir / "metrics"  # the workers' request counters, summed by each (gateway.metrics)
        metrics_dir.mkdir()
        self.env["PAGEGATE_METRICS_DIR"] = str(metrics_dir)
        self.engine: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = []
        self.socks: list[socket.socket] = []
        self.restarts: list[float] = []
        self.stopping = False

    def _spawn(self, args: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "gateway.workers", *args], env=self.env,
                                pass_fds=pass_fds, start_new_session=True,
                                preexec_fn=with_parent_death())

    def _start_worker(self, i: int) -> None:
        fd = self.socks[i].fileno()
        self.workers[i] = self._spawn(["worker", "--fd", str(fd), "--index", str(i + 1)], pass_fds=(fd,))

    def _engine_listening(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(self.socket_path)
                return True
            except OSError:
                return False

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("pagegate: %s: stopping the workers, then the engine", signal.Signals(signum).name)
        elif signum == signal.SIGINT:  # a second Ctrl+C: each worker's forced stop (gateway.shutdown)
            log.info("pagegate: SIGINT again: the workers stop now")
            for proc in self.workers:
                if proc is not None and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGINT)
        self.stopping = True

    def _listen(self) -> bool:
        s = self.settings
        try:
            self.socks = listeners(s.host, s.port, s.workers)
            return True
        except OSError as exc:
            print(f"error: cannot listen on {s.host}:{s.port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
            return False

    def run(self) -> int:
        # the port is checked now, but bound once the engine listens: until then a client is
        # refused at once instead of waiting in a queue nobody accepts from
        if not self._listen():
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return 1
        for sock in self.socks:
            sock.close()
        self.socks = []
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._run()
        finally:
            self._stop_all()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            for sock in self.socks:
                sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _run(self) -> int:
        s = self.settings
        if s.load_engine:
            self.engine = self._spawn(["engine", "--socket", self.socket_path])
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while self.engine is not None and not self._engine_listening():
            if self.stopping:
                return 0
            if self.engine.poll() is not None:
                log.error("pagegate: the engine process exited with %s while starting", self.engine.returncode)
                return 1
            if time.monotonic() > deadline:
                log.error("pagegate: the engine process did not listen within %.0f s", ENGINE_START_TIMEOUT_S)
                return 1
            time.sleep(0.1)
        if not self._listen():  # taken meanwhile
            return 1
        self.workers = [None] * s.workers
        for i in range(s.workers):
            self._start_worker(i)
        port = self.socks[0].getsockname()[1]
        log.info("pagegate: %d workers on http://%s:%d, %s", s.workers, s.host, port,
                 f"the engine in process {self.engine.pid}" if self.engine is not None else "no engine")
        while not self.stopping:
            time.sleep(0.2)
            if self.engine is not None and self.engine.poll() is not None:
                log.error("pagegate: the engine process exited with %s; stopping the service", self.engine.returncode)
                return 1
            for i, proc in enumerate(self.workers):
                if proc is not None and proc.poll() is not None and not self.stopping:
                    now = time.monotonic()
                    self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_S] + [now]
                    if len(self.restarts) > MAX_RESTARTS:
                        log.error("pagegate: workers exited %d times within %.0f s; stopping the service",
                                  len(self.restarts), RESTART_WINDOW_S)
                        return 1
                    log.error("pagegate: worker %d (process %d) exited with %s; starting it again",
                              i + 1, proc.pid, proc.returncode)
                    self._start_worker(i)
        return 0

    def _stop_all(self) -> None:
        for sock in self.socks:  # no new connections wait in a queue while the workers drain
            sock.close()
        self.socks = []
        self._stop([p for p in self.workers if p is not None])
        if self.engine is not None:
            self._stop([self.engine])

    @staticmethod
    def _stop(procs: list[subprocess.Popen]) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("pagegate: process %d did not stop within %.0f s; killing it", proc.pid, STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()


def run_workers(settings: Settings) -> int:
    """Serve with ``settings.workers`` workers (``gateway.serve.run`` has prepared Redis and the schema)."""
    return Supervisor(settings).run()


# ---- the children ----------------------------------------------------------------------------

def forget_run_dir_if_orphaned(socket_path: str, parent: int) -> bool:
    """After the engine process stops: when its supervisor is gone (SIGKILLed, so it could not),
    remove the private directory of the engine's socket. True when it did."""
    run_dir = Path(socket_path).parent
    if os.getppid() == parent or not run_dir.name.startswith("pagegate-"):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _engine_main(socket_path: str) -> int:
    from engine.ipc import serve_engine
    from engine.outputs import EngineDeadError
    from gateway.app import apply_gil_switch_interval
    from gateway.heap import tune_gc

    settings = Settings()
    logging.basicConfig(level=python_log_level(settings), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    apply_gil_switch_interval(settings)

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        drain = asyncio.Event()

        def on_signal() -> None:
            # the first: serve the fronts still connected until they close (a SIGTERM to the whole
            # group, as systemd sends it, reaches them too: they finish their requests first); the
            # supervisor signals the engine only once its workers are gone, so then it stops at once
            if drain.is_set() or not started:
                task.cancel()
            drain.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        started = False

        def ready() -> None:
            nonlocal started
            started = True
            tune_gc(settings)  # the model's objects out of the collector's sight, as in one process
            log.info("pagegate: the engine serves on %s", socket_path)

        try:
            await serve_engine(settings.engine_config(), socket_path, ready=ready, drain=drain)
        except asyncio.CancelledError:
            return 0
        except EngineDeadError:
            log.error("pagegate: the engine's step loop stopped; the engine process exits")
            return 1
        except Exception as exc:
            if started:
                raise
            # as one process reports it (gateway.middleware): the exception's line, the traceback at DEBUG
            log.debug("the engine could not start", exc_info=True)
            log.error("cannot start the gateway: %s", traceback.format_exception_only(exc)[-1].strip())
            return 1
        return 0

    parent = os.getppid()
    try:
        return _run_loop(main())
    finally:
        forget_run_dir_if_orphaned(socket_path, parent)


def _worker_main(fd: int, index: int) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.serve import redact_access_log, uvicorn_options
    from gateway.shutdown import DrainingServer

    settings = Settings(worker_index=str(index))
    logging.basicConfig(level=python_log_level(settings),
                        format=f"%(asctime)s %(levelname)s %(name)s[w{index}]: %(message)s")
    sock = socket.socket(fileno=fd)
    server = DrainingServer(uvicorn.Config(create_app(settings), **uvicorn_options(settings)))
    redact_access_log()
    server.run(sockets=[sock])
    return 0


def _run_loop(coro):  # noqa: ANN001, ANN202
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.workers", description="pagegate's child processes")
    sub = parser.add_subparsers(dest="role", required=True)
    engine = sub.add_parser("engine")
    engine.add_argument("--socket", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--fd", type=int, required=True)
    worker.add_argument("--index", type=int, default=1)
    args = parser.parse_args(argv)
    if args.role == "engine":
        return _engine_main(args.socket)
    return _worker_main(args.fd, args.index)


if __name__ == "__main__":
    from gateway.serve import exit_at_once

    exit_at_once(main)  # (without the interpreter's seconds-long teardown of the model's objects)
