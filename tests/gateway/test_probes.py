"""``/health`` and ``/metrics`` report Redis's and the database's state (``gateway.probes``): found
by QA, nothing told an operator that either was down while requests got 503s or rows piled up in
the spool. Real Redis servers and a real (unreachable) PostgreSQL address, no stand-ins."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import redis as redis_sync

from gateway.app import create_app
from gateway.db.session import Database
from gateway.errors import ApiError
from gateway.redis_server import EmbeddedRedis
from gateway.settings import Settings
from gateway.usage import UsageEvent
from tests.gateway.conftest import TENANCY_REDIS_URL
from tests.gateway.test_usage_writer import _add_tenant


def _series(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _settings(tmp_path, database_url: str, redis_url: str, redis_prefix: str) -> Settings:  # noqa: ANN001
    return Settings(database_url=database_url, redis_url=redis_url, redis_prefix=redis_prefix,
                    data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                    load_engine=False, cache_enabled=False, database_timeout_s=1.0)


@contextlib.asynccontextmanager
async def _app_on_own_redis(tmp_path, sqlite_url: str, redis_prefix: str):  # noqa: ANN001, ANN202
    """A gateway on a private Redis server, up and answering ``/health`` ok: (HTTP client, admin
    Redis client, the server)."""
    server = EmbeddedRedis(tmp_path / "own-redis")
    url = await asyncio.to_thread(server.start)
    app = create_app(_settings(tmp_path, sqlite_url, url, redis_prefix))
    admin = redis_sync.Redis.from_url(url)
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            assert (await client.get("/health")).json()["dependencies"]["redis"] == "ok"
            yield client, admin, server
    finally:
        admin.close()
        await asyncio.to_thread(server.stop)


def _row(n: int) -> UsageEvent:
    return UsageEvent(request_id=f"probe-{n}", tenant_id=1, model="m", status="ok", prompt_tokens=3,
                      completion_tokens=2, latency_ms=1.0, finish_reason="stop")


async def test_all_up_is_ok(tmp_path, sqlite_url, redis_prefix) -> None:  # noqa: ANN001
    app = create_app(_settings(tmp_path, sqlite_url, TENANCY_REDIS_URL, redis_prefix))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        body = (await client.get("/health")).json()
        assert body["status"] == "ok" and body["dependencies"] == {"redis": "ok", "database": "ok"}
        deps = (await client.get("/metrics")).json()["dependencies"]
        assert deps["redis"] == {"status": "ok", "error": None}
        assert deps["database"] == {"status": "ok", "error": None, "unavailable_for_s": None, "rows_waiting": 0,
                                    "spool_files": 0}
        got = _series((await client.get("/metrics", params={"format": "prometheus"})).text)
        assert got["pagegate_redis_up"] == 1 and got["pagegate_database_up"] == 1
        assert got["pagegate_usage_rows_waiting"] == 0 and got["pagegate_usage_spool_files"] == 0


async def test_a_database_down_is_degraded_with_its_backlog_and_back_to_ok(tmp_path, pg_template, pg_tools,
                                                                           redis_prefix) -> None:  # noqa: ANN001
    """Rows that cannot be inserted: ``/health`` 200 ``degraded`` (the database is every process's:
    a 503 would take them all out of a load balancer), ``/metrics`` the driver's error, for how
    long, the rows waiting and the spool's files; once the database takes them, ``ok`` again."""
    import uuid

    name = f"pgt_probe_{uuid.uuid4().hex[:8]}"  # does not exist yet: the database is "down"
    app = create_app(_settings(tmp_path, pg_tools.url(name), TENANCY_REDIS_URL, redis_prefix))
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            services = app.state.pagegate.services
            usage = services.usage
            # a key lookup that fails marks it too, with no usage row waiting (found by QA: requests got
            # 503 auth_unavailable while the gauge said the database was up)
            from gateway.keys import generate_key

            with pytest.raises(ApiError) as refused:
                await services.auth.authenticate(f"Bearer {generate_key().key}")
            assert refused.value.code == "auth_unavailable"
            body = (await client.get("/health")).json()
            assert body["status"] == "degraded" and body["dependencies"]["database"] == "unavailable"
            db = (await client.get("/metrics")).json()["dependencies"]["database"]
            assert db["status"] == "unavailable" and name in db["error"] and db["rows_waiting"] == 0
            got = _series((await client.get("/metrics", params={"format": "prometheus"})).text)
            assert got["pagegate_database_up"] == 0  # the gauge too, not only the JSON
            for n in range(5):
                usage.record(_row(n))
            assert await usage.flush() is False
            resp = await client.get("/health")
            assert resp.status_code == 200
            assert resp.json()["status"] == "degraded"
            assert resp.json()["dependencies"] == {"redis": "ok", "database": "unavailable"}
            assert "error" not in resp.text.lower()  # no error text on the open endpoint
            db = (await client.get("/metrics")).json()["dependencies"]["database"]
            assert db["status"] == "unavailable" and name in db["error"]  # asyncpg: database "…" does not exist
            assert db["unavailable_for_s"] >= 0 and db["rows_waiting"] == 5 and db["spool_files"] == 1
            got = _series((await client.get("/metrics", params={"format": "prometheus"})).text)
            assert got["pagegate_database_up"] == 0 and got["pagegate_usage_rows_waiting"] == 5
            assert got["pagegate_usage_spool_files"] == 1 and got["pagegate_redis_up"] == 1
            # the database comes back (made from the migrated template, so the rows' tenant exists)
            await pg_tools.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
            fresh = Database(pg_tools.url(name))
            await _add_tenant(fresh)
            await fresh.dispose()
            assert await usage.flush() is True
            with pytest.raises(ApiError):  # a lookup that reaches the database (no such key: 401) clears it
                await services.auth.authenticate(f"Bearer {generate_key().key}")
            body = (await client.get("/health")).json()
            assert body["status"] == "ok" and body["dependencies"]["database"] == "ok"
            db = (await client.get("/metrics")).json()["dependencies"]["database"]
            assert db == {"status": "ok", "error": None, "unavailable_for_s": None, "rows_waiting": 0,
                          "spool_files": 0}
    finally:
        await pg_tools.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_a_redis_down_is_degraded_and_a_ping_is_bounded(tmp_path, sqlite_url, redis_prefix) -> None:  # noqa: ANN001
    """A private Redis server, stopped under the running app: ``/health`` says ``degraded`` with
    ``redis: unavailable`` (and answers within the PING's bound), then ``ok`` once one is back."""
    from gateway import probes

    server = EmbeddedRedis(tmp_path / "own-redis")
    url = await asyncio.to_thread(server.start)
    app = create_app(_settings(tmp_path, sqlite_url, url, redis_prefix))
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            assert (await client.get("/health")).json()["dependencies"]["redis"] == "ok"
            await asyncio.to_thread(server.stop)
            await asyncio.sleep(probes.REUSE_S + 0.05)  # past the reuse of the last PING's outcome
            loop = asyncio.get_running_loop()
            started = loop.time()
            # concurrent checks share one PING
            answers = await asyncio.gather(*(client.get("/health") for _ in range(5)))
            assert loop.time() - started < probes.PING_TIMEOUT_S + 1.0
            for resp in answers:
                assert resp.status_code == 200
                assert resp.json()["status"] == "degraded"
                assert resp.json()["dependencies"]["redis"] == "unavailable"
            head = await client.head("/health")  # a load balancer's HEAD: the status alone, no PING
            assert head.status_code == 200
            redis = (await client.get("/metrics")).json()["dependencies"]["redis"]
            assert redis["status"] == "unavailable" and redis["error"]
            got = _series((await client.get("/metrics", params={"format": "prometheus"})).text)
            assert got["pagegate_redis_up"] == 0
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_redis_out_of_memory_or_read_only_is_degraded(tmp_path, sqlite_url, redis_prefix) -> None:  # noqa: ANN001
    """Found by a faults QA: out of memory or turned read-only, Redis answered PING while every
    request got 503 ``store_unavailable``, and /health said ok. The probe is a write."""
    from gateway import probes

    async with _app_on_own_redis(tmp_path, sqlite_url, redis_prefix) as (client, admin, _):
        for refuse, allow, says in (
                ([("CONFIG", "SET", "maxmemory-policy", "noeviction"), ("CONFIG", "SET", "maxmemory", "1")],
                 [("CONFIG", "SET", "maxmemory", "0")], "OutOfMemoryError"),
                ([("REPLICAOF", "127.0.0.1", "1")], [("REPLICAOF", "NO", "ONE")], "ReadOnlyError")):
            for command in refuse:
                await asyncio.to_thread(admin.execute_command, *command)
            await asyncio.sleep(probes.REUSE_S + 0.05)
            assert (await client.get("/health")).json()["dependencies"]["redis"] == "unavailable"
            redis = (await client.get("/metrics")).json()["dependencies"]["redis"]
            assert redis["status"] == "unavailable" and says in redis["error"], redis
            for command in allow:
                await asyncio.to_thread(admin.execute_command, *command)
            await asyncio.sleep(probes.REUSE_S + 0.05)
            assert (await client.get("/health")).json()["dependencies"]["redis"] == "ok"


async def test_a_hung_redis_is_found_out_and_no_check_waits_out_the_ping(tmp_path, sqlite_url,
                                                                        redis_prefix) -> None:  # noqa: ANN001
    """Found by QA: with Redis hung (``CLIENT PAUSE``), every check waited the PING's whole second,
    past a load balancer's 1 s timeout. A check waits for a fresh PING at most ``ANSWER_WITHIN_S``,
    then answers with the last outcome; the PING's timeout, a second later, says unavailable."""
    from gateway import probes

    async with _app_on_own_redis(tmp_path, sqlite_url, redis_prefix) as (client, admin, _):
        await asyncio.to_thread(admin.execute_command, "CLIENT", "PAUSE", "4000", "ALL")
        await asyncio.sleep(probes.REUSE_S + 0.05)
        loop = asyncio.get_running_loop()
        seen, slowest = [], 0.0
        deadline = loop.time() + probes.PING_TIMEOUT_S + 1.5
        while loop.time() < deadline and "unavailable" not in seen:
            started = loop.time()
            seen.append((await client.get("/health")).json()["dependencies"]["redis"])
            slowest = max(slowest, loop.time() - started)
            await asyncio.sleep(0.1)
        assert seen[-1] == "unavailable", seen  # found out once the PING timed out
        assert slowest < probes.PING_TIMEOUT_S - 0.25, (slowest, seen)  # (each check: ~ANSWER_WITHIN_S)


async def test_a_dev_server_on_the_public_secret_answers_loopback_names_only(tmp_path, sqlite_url,
                                                                             redis_prefix) -> None:  # noqa: ANN001
    """Found by a security QA: a page whose domain rebinds to 127.0.0.1 reached a ``--dev`` server
    as the same origin and minted admin tokens with the public built-in secret. Every response
    also says ``nosniff`` (JSON that echoes input had none)."""
    dev = _settings(tmp_path, sqlite_url, TENANCY_REDIS_URL, redis_prefix).model_copy(update={"dev_mode": True})
    assert dev.placeholder_admin_secret
    app = create_app(dev)
    async with app.router.lifespan_context(app):
        for base, refused in (("http://attacker.example:8000", True), ("http://127.0.0.1:8000", False),
                              ("http://localhost", False), ("http://[::1]:8000", False), ("http://127.0.0.2", False),
                              ("http://localhost.evil.example", True)):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as client:
                for path in ("/health", "/admin/v1/tenants", "/v1/models"):
                    resp = await client.get(path)
                    assert (resp.status_code == 421) is refused, (base, path, resp.status_code)
                    assert resp.headers["x-content-type-options"] == "nosniff"
                    if path.startswith("/admin/v1"):  # (a new key is answered in clear there)
                        assert resp.headers["cache-control"] == "no-store"
                    if refused:
                        assert resp.json()["error"]["code"] == "misdirected_request"
    own = create_app(dev.model_copy(update={"admin_jwt_secret": "s" * 40}))  # a secret of one's own: any name
    async with own.router.lifespan_context(own), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=own), base_url="http://gateway.example") as client:
        assert (await client.get("/health")).status_code == 200
