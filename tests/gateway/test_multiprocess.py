"""Several gateway processes share one Redis and one database and behave as one: an RPM limit
holds across two ``pagegate serve`` processes, and a key revoked through one is refused by the other
within a second. (The budget under 50 concurrent HTTP requests is in test_quota_http.py.)"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway import tenancy as svc
from gateway.db.session import Database

REDIS_URL = os.environ.get("PAGEGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """``pagegate serve`` in a subprocess (no engine: auth, limits and admin paths only)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.serve", "--port", str(self.port)],
                                     env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {Path(self._log.name).read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(Path(self._log.name).read_text())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory):
    """Two gateway processes on one SQLite database and one Redis key prefix."""
    from gateway.db.session import upgrade_sync

    tmp = tmp_path_factory.mktemp("multiproc")
    db_url = f"sqlite+aiosqlite:///{tmp / 'pagegate.db'}"
    upgrade_sync(db_url)
    prefix = f"pgt:mp{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, "PAGEGATE_DATABASE_URL": db_url, "PAGEGATE_REDIS_URL": REDIS_URL,
           "PAGEGATE_REDIS_PREFIX": prefix, "PAGEGATE_DATA_DIR": str(tmp / "data"),
           "PAGEGATE_USAGE_SPOOL_DIR": str(tmp / "spool"), "PAGEGATE_LOAD_ENGINE": "false",
           "PAGEGATE_CACHE_ENABLED": "false", "PAGEGATE_LOG_LEVEL": "warning"}
    gateways = [Gateway(env, tmp / f"gw{i}.log") for i in range(2)]
    try:
        for g in gateways:
            g.wait_ready()
        yield gateways, db_url, prefix
    finally:
        for g in gateways:
            g.stop()

        async def cleanup() -> None:
            from redis.asyncio import Redis

            r = Redis.from_url(REDIS_URL)
            keys = [k async for k in r.scan_iter(match=prefix + "*")]
            if keys:
                await r.delete(*keys)
            await r.aclose()

        asyncio.run(cleanup())


async def _tenant_with_key(db_url: str, **kwargs) -> tuple[str, int, str]:
    db = Database(db_url)
    try:
        async with db.sessionmaker() as s:
            tenant = await svc.create_tenant(s, name=f"mp-{uuid.uuid4().hex[:8]}", **kwargs)
            row, new = await svc.create_api_key(s, tenant_id=tenant.id)
            await s.commit()
        return new.key, row.id, row.key_hash
    finally:
        await db.dispose()


async def test_rpm_limit_holds_across_two_processes(two_gateways):
    (a, b), db_url, _ = two_gateways
    key, _, _ = await _tenant_with_key(db_url, rpm=6)
    headers = {"authorization": f"Bearer {key}"}
    statuses = []
    async with httpx.AsyncClient(timeout=10) as client:
        for i in range(12):
            r = await client.get((a if i % 2 else b).url + "/v1/models", headers=headers)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
                assert int(r.headers["retry-after"]) >= 1
            else:
                assert r.headers["x-ratelimit-limit-requests"] == "6"
    assert statuses.count(200) == 6 and statuses.count(429) == 6
    assert statuses[:6] == [200] * 6  # both processes counted into one window


async def test_key_revoked_through_one_process_is_refused_by_the_other_within_1s(two_gateways):
    from redis.asyncio import Redis

    (a, b), db_url, prefix = two_gateways
    key, key_id, key_hash = await _tenant_with_key(db_url, rpm=0)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=10) as client:
        for g in (a, b):  # both processes have the principal cached now (key_cache_ttl_s = 30 s)
            assert (await client.get(g.url + "/v1/models", headers=headers)).status_code == 200
        # revoke as the admin CLI does: database, then one Redis publish
        db = Database(db_url)
        redis = Redis.from_url(REDIS_URL)
        try:
            async with db.sessionmaker() as s:
                await svc.revoke_key(s, key_id=key_id)
                await s.commit()
            await svc.publish_invalidation(redis, prefix, key_hash=key_hash)
            revoked_at = time.monotonic()
        finally:
            await redis.aclose()
            await db.dispose()
        refused_after = {}
        while len(refused_after) < 2 and time.monotonic() - revoked_at < 1.0:
            for name, g in (("a", a), ("b", b)):
                if name not in refused_after:
                    r = await client.get(g.url + "/v1/models", headers=headers)
                    if r.status_code == 401:
                        refused_after[name] = time.monotonic() - revoked_at
            await asyncio.sleep(0.02)
    assert set(refused_after) == {"a", "b"}, refused_after
    assert max(refused_after.values()) < 1.0


async def test_disabled_tenant_is_refused_by_both_processes(two_gateways):
    from redis.asyncio import Redis

    (a, b), db_url, prefix = two_gateways
    key, _, _ = await _tenant_with_key(db_url, rpm=0)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=10) as client:
        for g in (a, b):
            assert (await client.get(g.url + "/v1/models", headers=headers)).status_code == 200
        db = Database(db_url)
        redis = Redis.from_url(REDIS_URL)
        try:
            async with db.sessionmaker() as s:
                p = (await svc.list_keys(s, tenant_id=(await _tenant_id(s, key))))[0]
                t = await svc.set_tenant_enabled(s, tenant_id=p.tenant_id, enabled=False)
                await s.commit()
            await svc.publish_invalidation(redis, prefix, tenant_id=t.id)
        finally:
            await redis.aclose()
            await db.dispose()
        await asyncio.sleep(1.0)
        for g in (a, b):
            r = await client.get(g.url + "/v1/models", headers=headers)
            assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_disabled"


async def _tenant_id(session, key: str) -> int:
    from sqlalchemy import select

    from gateway.db.models import ApiKey
    from gateway.keys import hash_key

    return (await session.execute(select(ApiKey.tenant_id).where(ApiKey.key_hash == hash_key(key)))).scalar_one()


RESERVER = r"""
import asyncio, json, sys
from gateway.settings import Settings
from gateway.tenancy_services import build_tenancy
from gateway.errors import ApiError

async def main(key, n):
    settings = Settings()
    services = await build_tenancy(settings, redis_url=settings.redis_url)
    principal = await services.auth.authenticate("Bearer " + key)
    await asyncio.sleep(max(0.0, float(sys.argv[3]) - __import__("time").time()))  # start together

    async def one():
        try:
            r = await services.quota.reserve(principal, model="m", prompt_tokens=10, max_tokens=20)
        except ApiError as e:
            return e.code
        await asyncio.sleep(0.05)
        await services.quota.settle(r, prompt_tokens=10, completion_tokens=20)
        return r.reserved_tokens

    out = await asyncio.gather(*(one() for _ in range(n)))
    await services.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def test_budget_holds_for_50_concurrent_reservations_from_two_processes(tmp_path, two_gateways):
    import json

    _, db_url, prefix = two_gateways
    key, _, _ = await _tenant_with_key(db_url, budget_tokens=10 * 30, tpm=0)
    env = {**os.environ, "PAGEGATE_DATABASE_URL": db_url, "PAGEGATE_REDIS_URL": REDIS_URL,
           "PAGEGATE_REDIS_PREFIX": prefix, "PAGEGATE_USAGE_SPOOL_DIR": str(tmp_path / "spool")}
    start_at = str(time.time() + 8)
    procs = [subprocess.Popen([sys.executable, "-c", RESERVER, key, "25", start_at], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = []
    for p in procs:
        out, err = await asyncio.to_thread(p.communicate, timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
        results += json.loads(out.decode().strip().splitlines()[-1])
    accepted = [r for r in results if isinstance(r, int)]
    assert len(results) == 50
    assert len(accepted) == 10 and sum(accepted) <= 300
    # refused while the accepted ones ran (their reservations held the budget), or after they had spent it
    assert set(r for r in results if not isinstance(r, int)) <= {"rate_limit_exceeded", "insufficient_quota"}
