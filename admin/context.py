"""What the admin surface runs on: the database, Redis (for invalidations) and the token
verifier, built from ``Settings`` on first use and closed with the app."""

from __future__ import annotations

from redis.asyncio import Redis

from admin.auth import AdminTokenVerifier
from gateway.db.session import Database
from gateway.settings import Settings


class AdminContext:
    """Lazily opened resources. Pass ``database``/``redis`` to share the gateway's own (they are
    then not closed here); otherwise they are created from ``settings`` and closed by ``aclose``."""

    def __init__(self, settings: Settings, *, database: Database | None = None,
                 redis: Redis | None = None) -> None:
        self.settings = settings
        self.verifier = AdminTokenVerifier(settings)
        self._database, self._owns_db = database, database is None
        self._redis, self._owns_redis = redis, redis is None
        self._adopted = False

    def adopt(self, app: object) -> None:
        """Share the hosting gateway's database and Redis (``app.state.pagegate.services``) when
        this context has not opened its own: with an embedded Redis (no PAGEGATE_REDIS_URL) that is
        the only Redis the gateway's auth cache listens on. Called on each request; acts once."""
        if self._adopted:
            return
        self._adopted = True
        services = getattr(getattr(getattr(app, "state", None), "pagegate", None), "services", None)
        if services is None:
            return
        if self._database is None and getattr(services, "db", None) is not None:
            self._database, self._owns_db = services.db, False
        if self._redis is None and getattr(services, "redis", None) is not None:
            self._redis, self._owns_redis = services.redis, False

    @property
    def database(self) -> Database:
        if self._database is None:
            self._database = Database(self.settings.database_url)
        return self._database

    @property
    def redis(self) -> Redis | None:
        """None when no Redis URL is configured (nothing to invalidate: no shared gateways)."""
        if self._redis is None and self.settings.redis_url:
            self._redis = Redis.from_url(self.settings.redis_url)
        return self._redis

    async def aclose(self) -> None:
        if self._owns_redis and self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self._owns_db and self._database is not None:
            await self._database.dispose()
            self._database = None
