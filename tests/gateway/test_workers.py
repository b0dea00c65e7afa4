"""``pagegate serve --workers 2`` as an operator runs it: one engine process, two HTTP workers on
one port. Through HTTP with the official ``openai`` client: both workers answer, streams and usage
rows are whole, a worker that dies is started again, a SIGTERM stops every process, and an engine
process that dies stops the service (its workers answer 503 meanwhile, never hang)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from gateway import tenancy as svc
from gateway.db.session import Database

pytestmark = pytest.mark.slow

REDIS_URL = os.environ.get("PAGEGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


class Service:
    def __init__(self, tmp: Path, **env_extra: str) -> None:
        self.tmp = tmp
        self.db_url = f"sqlite+aiosqlite:///{tmp / 'w.db'}"
        self.prefix = f"pgw:{uuid.uuid4().hex[:8]}:"
        self.key = asyncio.run(self._tenant())
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEGATE_")}
        env.update(PAGEGATE_DATABASE_URL=self.db_url, PAGEGATE_REDIS_URL=REDIS_URL, PAGEGATE_REDIS_PREFIX=self.prefix,
                   PAGEGATE_DATA_DIR=str(tmp / "data"), PAGEGATE_USAGE_SPOOL_DIR=str(tmp / "spool"),
                   PAGEGATE_USAGE_FLUSH_INTERVAL_S="0.05", PAGEGATE_USAGE_DB_INTERVAL_S="0.1",
                   PAGEGATE_CACHE_ENABLED="false", PAGEGATE_LOG_LEVEL="warning", PAGEGATE_MODEL=MODEL,
                   PAGEGATE_WEIGHTS_CACHE_DIR=str(ROOT / "data" / "weights"), PAGEGATE_NUM_BLOCKS="256",
                   PAGEGATE_MAX_MODEL_LEN="1024", PAGEGATE_MAX_NUM_SEQS="16", PAGEGATE_DEVICE="cpu",
                   PAGEGATE_NUM_THREADS="1", **env_extra)
        self.log = open(tmp / "serve.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.serve", "--workers", "2",
                                      "--port", str(self.port)], env=env, cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    async def _tenant(self) -> str:
        db = Database(self.db_url)
        await db.upgrade()
        async with db.sessionmaker() as s:
            tenant = await svc.create_tenant(s, name="w", rpm=100_000, tpm=10**8)
            _, new = await svc.create_api_key(s, tenant_id=tenant.id)
            await s.commit()
        await db.dispose()
        return new.key

    def logs(self) -> str:
        return (self.tmp / "serve.log").read_text(errors="replace")

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("not healthy in time:\n" + self.logs())

    def pids_serving(self, n: int = 24) -> set[int]:
        pids = set()
        for _ in range(n):  # a new connection each: the kernel spreads them over the workers' sockets
            with httpx.Client() as c:
                pids.add(c.get(self.url + "/metrics", timeout=10).json()["pid"])
        return pids

    def roles(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"engine": [], "worker": []}
        for pid in _children(self.proc.pid):
            cmd = _cmdline(pid)
            for role in out:
                if f"gateway.workers {role}" in cmd:
                    out[role].append(pid)
        return out

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, timeout=120)

    def usage_rows(self) -> list:
        from sqlalchemy import select

        from gateway.db.models import UsageRecord

        async def rows() -> list:
            db = Database(self.db_url)
            try:
                async with db.sessionmaker() as s:
                    return list((await s.execute(select(UsageRecord))).scalars())
            finally:
                await db.dispose()

        return asyncio.run(rows())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def service(tmp_path):
    s = Service(tmp_path)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()
        from redis import Redis

        r = Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=s.prefix + "*"))
        if keys:
            r.delete(*keys)
        r.close()


def test_two_workers_serve_one_engine(service: Service) -> None:
    roles = service.roles()
    assert len(roles["engine"]) == 1 and len(roles["worker"]) == 2, roles
    assert service.pids_serving() == set(roles["worker"])  # both workers take connections
    client = service.client()
    ids = []
    for i in range(4):  # new connections: both workers hand requests to the one engine
        with service.client() as c:
            reply = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Say {i}."}],
                                              max_tokens=5, temperature=0)
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5
        ids.append(reply._request_id)  # x-request-id: the usage row's request id
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}], max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the same greedy request through either worker gives the same text
    texts = set()
    for _ in range(4):
        with service.client() as c:
            texts.add(c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                           temperature=0).choices[0].text)
    assert len(texts) == 1
    # a batch of prompts crosses the socket as one engine request each, merged back in order
    batch = client.completions.create(model=MODEL, prompt=["One, two,", "The capital of France is"], max_tokens=4,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[1].text in texts
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 1200}],
                                       max_tokens=4)
    assert too_long.value.code == "context_length_exceeded"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = service.usage_rows()
        if len(rows) >= 10:
            break
        time.sleep(0.2)
    assert {r.request_id for r in rows} >= set(ids)
    assert sum(r.completion_tokens for r in rows if r.status == "ok") == 5 * 4 + 6 + 4 * 4 + 2 * 4
    # Prometheus: whichever worker answers, the whole service's counters (each adds the others' files,
    # written every second)
    time.sleep(1.5)
    for _ in range(6):
        with httpx.Client() as c:
            text = c.get(service.url + "/metrics", headers={"accept": "text/plain"}, timeout=10).text
        assert prometheus_sum(text, "pagegate_completion_tokens_total") == 5 * 4 + 6 + 4 * 4 + 2 * 4
        assert prometheus_sum(text, "pagegate_requests_total") == len(rows)
    # JSON mode and a schema through a worker: checked there, decoded under masks the engine's process built
    cat = client.chat.completions.create(
        model=MODEL, response_format={"type": "json_object"}, max_tokens=120, temperature=0,
        messages=[{"role": "user", "content": "Describe a cat as JSON with the keys name, age and color."}])
    assert cat.choices[0].finish_reason == "stop" and isinstance(json.loads(cat.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {  # (rules too: the engine's process compiles the pattern)
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 30}}, "required": ["name", "age"], "additionalProperties": False}
    tom = client.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0, response_format={"type": "json_schema", "json_schema": {
            "name": "cat", "schema": schema}},
        messages=[{"role": "user", "content": "Tell me about a cat called Tom, 4 years old."}])
    assert json.loads(tom.choices[0].message.content) == {"name": "Tom", "age": 4}
    # tool calls through a worker: "required" decodes a call; under "auto" (json_optional, on the
    # wire) this model answers "Hi!" in text, where a lost flag would have held it to a call
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    called = client.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, tools=[weather],
                                            tool_choice="required",
                                            messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert called.choices[0].finish_reason == "tool_calls"
    assert "city" in json.loads(called.choices[0].message.tool_calls[0].function.arguments)
    said = client.chat.completions.create(model=MODEL, max_tokens=20, temperature=0, tools=[weather],
                                          messages=[{"role": "user", "content": "Hi!"}])
    assert said.choices[0].message.content and said.choices[0].message.tool_calls is None


def prometheus_sum(text: str, name: str) -> float:
    """The sum of a metric's series in Prometheus's text format."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_a_dead_worker_is_started_again_and_sigterm_stops_all(service: Service) -> None:
    for _ in range(4):  # requests through both workers, counted in /metrics
        with service.client() as c:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    time.sleep(1.5)
    workers = service.roles()["worker"]
    os.kill(workers[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = service.roles()["worker"]
        if len(now) == 2 and workers[0] not in now:
            try:
                if service.pids_serving(12) == set(now):
                    break
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    else:
        raise AssertionError(f"worker not replaced: {service.roles()}\n{service.logs()}")
    reply = service.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=2)
    assert reply.usage.completion_tokens == 2
    time.sleep(1.5)
    for _ in range(6):  # the new worker read its predecessor's counters back: the sums never go down
        with httpx.Client() as c:
            text = c.get(service.url + "/metrics?format=prometheus", timeout=10).text
        assert prometheus_sum(text, "pagegate_completion_tokens_total") == 4 + 2
    children = _children(service.proc.pid)
    assert service.stop() == 0, service.logs()
    assert not [p for p in children if _alive(p)]
    assert "exited with -9; starting it again" in service.logs()


def test_engine_death_fails_requests_and_stops_the_service(service: Service) -> None:
    children = _children(service.proc.pid)
    (engine,) = service.roles()["engine"]
    client = service.client()
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell a story."}],
                                            max_tokens=500, stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    os.kill(engine, signal.SIGKILL)
    with pytest.raises(openai.APIError):  # the stream ends in an error event or a broken connection
        for _ in stream:
            pass
    assert service.proc.wait(60) == 1, service.logs()
    deadline = time.monotonic() + 30
    while [p for p in children if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if _alive(p)]
    assert "the engine process exited" in service.logs()


def test_workers_without_an_engine(tmp_path) -> None:
    """PAGEGATE_LOAD_ENGINE=false: the workers serve the admin and key paths, no engine process."""
    service = Service(tmp_path, PAGEGATE_LOAD_ENGINE="false")
    try:
        service.wait_ready()
        roles = service.roles()
        assert roles["engine"] == [] and len(roles["worker"]) == 2, roles
        assert httpx.get(service.url + "/health", timeout=10).json()["model"] is None
        with pytest.raises(openai.NotFoundError):
            service.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert service.stop() == 0, service.logs()
    finally:
        service.stop()


def test_a_worker_whose_engine_is_gone_answers_503(api, api_engine, tmp_path) -> None:  # noqa: ANN001
    """The gateway on a RemoteEngine whose engine process went away: 503 engine_unavailable (the
    notice is not taken, generate says why), never a 500; /health 503."""
    from engine.ipc import EngineServer
    from engine.remote_engine import RemoteEngine

    async def dead_remote() -> RemoteEngine:
        server = EngineServer(api_engine, tmp_path / "engine.sock")
        await server.start()
        remote = RemoteEngine(server.path, connect_timeout_s=5)
        await remote.start()
        lost: list = []
        remote.on_lost = lambda: lost.append(True)
        await server.close()  # the engine process's side goes away
        for _ in range(100):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert lost and remote.is_dead and remote.announce() is None
        return remote

    remote = api.loop.run(dead_remote())
    state = api.app.state.pagegate
    saved = state.engine
    state.engine = remote
    try:
        with pytest.raises(openai.InternalServerError) as err:
            api.openai().chat.completions.create(model=api.model, max_tokens=1,
                                                 messages=[{"role": "user", "content": "Hi"}])
        assert err.value.status_code == 503 and err.value.code == "engine_unavailable"
        assert httpx.get(api.base_url + "/health", timeout=10).status_code == 503
    finally:
        state.engine = saved
        api.loop.run(remote.shutdown())


def test_a_child_whose_supervisor_died_before_its_prctl_exits() -> None:
    """``die_with_parent``: the supervisor's death signal is armed, and a child that was already
    handed to another parent (its supervisor gone between fork and ``prctl``) exits at once."""
    import functools

    from gateway.workers import die_with_parent, with_parent_death

    orphan = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(die_with_parent, os.getpid() + 10**6, None))
    assert orphan.wait(timeout=10) == 1
    child = subprocess.Popen(["sleep", "30"], preexec_fn=with_parent_death())
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)  # its parent is alive: it runs
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("other_reuses_port", [True, False])
def test_listeners_refuse_a_port_another_process_listens_on(other_reuses_port: bool) -> None:
    """Another ``--workers`` service (SO_REUSEPORT listeners, same user) must not share the port."""
    from gateway.workers import listeners

    with socket.socket() as other:
        if other_reuses_port:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError):
            listeners("127.0.0.1", other.getsockname()[1], 2)
    socks = listeners("127.0.0.1", 0, 2)  # a free port: both sockets share it
    try:
        assert len({s.getsockname()[1] for s in socks}) == 1
    finally:
        for s in socks:
            s.close()


def test_the_engine_removes_its_socket_dir_only_when_its_supervisor_is_gone(tmp_path) -> None:
    """A supervisor killed with SIGKILL cannot remove the engine socket's private directory; the
    engine process, stopped by the death signal, does. With its supervisor alive it leaves it."""
    from gateway.workers import forget_run_dir_if_orphaned

    run_dir = tmp_path / "pagegate-abc"
    run_dir.mkdir()
    socket_path = str(run_dir / "engine.sock")
    assert not forget_run_dir_if_orphaned(socket_path, os.getppid())  # the supervisor lives: its job
    assert run_dir.exists()
    assert forget_run_dir_if_orphaned(socket_path, os.getppid() + 10**6)  # another parent: orphaned
    assert not run_dir.exists()
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert not forget_run_dir_if_orphaned(str(other / "engine.sock"), os.getppid() + 10**6)  # not ours
    assert other.exists()


@pytest.mark.parametrize("dev", [True, False])
def test_the_workers_serve_in_the_supervisors_mode(dev) -> None:  # noqa: ANN001
    """Found by QA: ``--dev --workers 2`` ran its workers outside dev mode, so they refused the
    tokens the dev banner tells one to mint (signed with the placeholder secret)."""
    import shutil

    from gateway.settings import Settings
    from gateway.workers import Supervisor

    sup = Supervisor(Settings(dev_mode=dev, redis_url="redis://127.0.0.1:6379/0", load_engine=False))
    try:
        assert sup.env["PAGEGATE_DEV_MODE"] == ("true" if dev else "false")
    finally:
        shutil.rmtree(sup.run_dir, ignore_errors=True)
