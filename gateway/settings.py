"""All of pagegate's settings: one pydantic-settings class (env prefix ``PAGEGATE_``), read once at
start and passed down. No other module of the gateway reads the environment (`kernels/`, which does not depend on
it, reads `PAGEGATE_KERNEL_CACHE`)."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url

from engine.config import EngineConfig

# what a PostgreSQL URL's query may hold: asyncpg's connect arguments that are text (SQLAlchemy
# passes the query through; anything else was a TypeError at the first connect)
# what a PostgreSQL URL's query may hold: asyncpg's connect arguments that are text, with the values
# asyncpg takes where it checks them (SQLAlchemy passes the query through as strings: a number such as
# ``statement_cache_size=100`` was a TypeError at the first connect; timeouts are PAGEGATE_DATABASE_TIMEOUT_S)
_ASYNCPG_QUERY = frozenset({"ssl", "target_session_attrs", "passfile", "service", "servicefile", "krbsrvname",
                            "gsslib", "host", "port", "prepared_statement_cache_size"})
_ASYNCPG_VALUES = {
    "ssl": frozenset("disable allow prefer require verify-ca verify-full".split()),
    "target_session_attrs": frozenset("any primary standby prefer-standby read-write read-only".split()),
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an address, an IPv6 address in brackets) is this machine only:
    localhost, 127.0.0.0/8, ::1, or ::ffff:127.x; any other name may resolve anywhere."""
    host = host.strip().strip("[]").lower()
    if host in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PAGEGATE_", env_file=None, extra="ignore")

    # server
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = 8000
    dev_mode: bool = False  # `make run`: create a default tenant + key on an empty database
    log_level: str = "info"  # critical | error | warning (warn) | info | debug | trace, any case
    # uvicorn's access log (one line per request at log level info); every request also has its
    # usage row. Off saves ~0.08 ms of event-loop CPU per request (README, Overhead)
    access_log: bool = True
    # a request body over this many bytes is refused with 413 (a whole context of text is ~100 KB)
    max_request_bytes: int = Field(default=8 * 2**20, ge=1024)
    # a request's head (request line and headers) over this many bytes gets 431, and one not
    # complete this long after its connection opened or its first byte came gets 408; either way
    # the connection is closed (gateway/http_guard.py)
    max_header_bytes: int = Field(default=64 * 1024, ge=4096)
    header_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # open connections from one client address beyond which a new one gets 429 and is closed (0: no
    # limit); the proxies of forwarded_allow_ips are not counted (gateway/http_guard.py)
    max_connections_per_address: int = Field(default=256, ge=0)
    # proxies whose X-Forwarded-For names the client (comma-separated addresses or networks, "*"
    # for any); empty: the connection's own address, the client's for the per-address limit
    forwarded_allow_ips: str = ""
    # browsers may call the API from these origins (comma-separated, "*" for any; empty: no CORS,
    # preflights get 405): the API keys then live in those pages, so list only your own apps
    cors_allow_origins: str = ""
    # HTTP worker processes. Above 1, `pagegate serve` runs the engine in a process of its own and
    # this many workers in front of it on one port, each admitting its share of the requests on
    # its own core (README, Workers); 1: one process serves everything
    workers: int = Field(default=1, ge=1, le=64)
    # a worker's engine: the Unix socket of an engine process (`pagegate serve --workers` sets it);
    # unset: the engine runs in this process
    engine_socket: str | None = None
    # a worker's index and the directory where the workers share their request counters for
    # GET /metrics (`pagegate serve --workers` sets both)
    worker_index: str | None = None
    metrics_dir: str | None = None
    # GET /metrics answers only `Authorization: Bearer <this>` (Prometheus's `authorization`
    # setting); unset: anyone who reaches the port, tenants included, reads it (per-tenant spend)
    metrics_token: str | None = Field(default=None, min_length=16)

    # storage
    database_url: str = "sqlite+aiosqlite:///./data/pagegate.db"
    redis_url: str | None = None  # unset: `pagegate serve` starts an embedded Redis server
    redis_prefix: str = "pg:"  # every Redis key starts with this
    # a Redis that stops answering (not refusing connections) fails a call after this long: the
    # limits and quotas then answer 503 instead of hanging every request
    redis_timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    # a PostgreSQL statement or connect that takes longer fails (503 where a request needed it;
    # the usage writer retries); SQLite waits on its busy timeout
    database_timeout_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    # the directory of every local default: the SQLite database, the usage spool, the converted
    # weights and the embedded Redis's snapshot; a path set on its own stays where it is set
    data_dir: str = Field(default="./data", min_length=1)  # (empty: every file in the working directory)
    # (empty: the working directory, whose files the spool would adopt or set aside; found by QA)
    usage_spool_dir: str = Field(default="./data/usage-spool", min_length=1)
    usage_flush_interval_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    # the spooled rows go into the database this often, or as soon as usage_batch_size wait: each
    # insert's thread hand-offs slow the engine's steps (~4% at one insert every 0.5 s, ~1% at 2 s)
    usage_db_interval_s: float = Field(default=2.0, ge=0, le=3600, allow_inf_nan=False)
    usage_batch_size: int = Field(default=500, ge=1)
    # a request's quota settlement runs this long after its response, in batches
    # (gateway/aftercare.py); 0: before the response
    settle_delay_ms: float = Field(default=20.0, ge=0, le=60_000, allow_inf_nan=False)  # (inf: never settled, QA)

    # engine
    model: str = "smollm2-135m-instruct"
    served_model_name: str | None = None
    weights_cache_dir: str = Field(default="./data/weights", min_length=1)
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    kv_cache_memory_gb: float = 1.0
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_waiting: int = 1024
    # requests one tenant may have waiting for the engine (429 past it; found by QA: one tenant's
    # batches filled the whole queue and every other tenant got 503); unset: a quarter of max_waiting
    max_waiting_per_tenant: int | None = Field(default=None, ge=1)
    admission_gap_ms: float = 1.0  # engine: from idle, gather a burst while arrivals are this close
    admission_max_wait_ms: float = 10.0
    admission_notice_gap_ms: float = 0.2  # engine: after the last announced request (each /v1 generation is)
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    linear_backend: str = "auto"  # "auto": oneDNN prepacked GEMM on CPU | "onednn" | "torch"
    num_threads: int | None = None
    load_engine: bool = True  # False: no in-process engine (admin-only process)
    # sys.setswitchinterval while serving (Python's default: 5 ms): how long the engine's step
    # thread may keep the GIL once the event loop asks for it; 0: leave Python's default
    gil_switch_interval_ms: float = Field(default=1.0, ge=0, le=1000, allow_inf_nan=False)
    # once started: freeze every object alive then (the model, torch, the libraries: ~425k) out of
    # the garbage collector's sight, so full collections stop walking them (~240 ms each); see
    # gateway/heap.py
    gc_freeze: bool = True

    # tenancy defaults
    # (0: no limit; a negative value was taken as none, silently: refused, as the admin API refuses it)
    default_rpm: int = Field(default=600, ge=0)
    default_tpm: int = Field(default=200_000, ge=0)
    ip_rpm: int = Field(default=6000, ge=0)  # per client address on /v1, before auth (slowapi); 0: off
    key_cache_ttl_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)  # revocations are pushed through Redis

    # semantic cache
    cache_enabled: bool = True
    # the ranges the admin API takes for a tenant's own values (admin/schemas.py)
    cache_threshold: float = Field(default=0.90, gt=0, le=1, allow_inf_nan=False)  # (nan: "<= 1", QA)
    cache_ttl_s: int = Field(default=86_400, ge=1)
    cache_max_entries: int = Field(default=10_000, ge=1)
    # the verifier's qualifier guard ("Is Pluto a (dwarf) planet?"): off serves more paraphrases that
    # add words, and the wrong answers it refuses (README, Semantic cache: heldout8)
    cache_qualifier_guard: bool = True
    # identical cacheable JSON misses in flight at once are answered by one engine request (gateway.flights)
    cache_coalesce: bool = True
    embedding_model: str = "all-MiniLM-L6-v2"

    # admin
    admin_jwt_secret: str = Field(default="change-me-admin-secret-at-least-32-bytes!!")
    admin_jwt_issuer: str = "pagegate"
    # the audience admin tokens are for: a token that names others in ``aud`` (one an identity
    # provider issued for another API) is refused; an identity provider's token must name it
    admin_jwt_audience: str = "pagegate-admin"
    admin_jwks_url: str | None = None  # URL or file path of a JWKS for RS256/ES256 tokens
    admin_token_ttl_s: int = Field(default=3600, ge=1)

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        """One of uvicorn's levels, any case; "warn" is "warning" (found by QA: "warn" and "trace"
        were tracebacks at start)."""
        level = value.strip().lower()
        level = "warning" if level == "warn" else level
        if level not in LOG_LEVELS:
            raise ValueError(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        """The async driver of a supported database, named or not: ``postgresql://`` (and
        ``postgres://``, ``postgresql+psycopg2://``…) is read with asyncpg, ``sqlite://`` with
        aiosqlite, and libpq's ``sslmode`` becomes asyncpg's ``ssl`` (found by QA: the URL most users
        type was a traceback in the admin CLI); another database is refused by name."""
        authority = value.strip().partition("://")[2].partition("/")[0]
        if authority.count("@") > 1:  # found by QA: read as host "ss@127.0.0.1", a DNS error that showed "ss"
            raise ValueError("the URL's user name or password holds an '@': percent-encode it as %40 (e.g. "
                             "postgresql+asyncpg://user:p%40ss@host:5432/db)")
        try:
            url = make_url(value.strip())
            url = url.set(drivername=url.drivername.lower())  # (a scheme is case-insensitive)
        except Exception:  # noqa: BLE001 - SQLAlchemy's ArgumentError, or a port that is not a number
            raise ValueError("not a database URL (e.g. postgresql+asyncpg://user:pass@host:5432/db or "
                             "sqlite+aiosqlite:///./data/pagegate.db)") from None
        if url.port is not None and not 0 < url.port < 65536:
            raise ValueError(f"the port must be between 1 and 65535, not {url.port}")
        backend = url.drivername.partition("+")[0]
        if backend in ("postgresql", "postgres"):
            unknown = sorted(set(url.query) - _ASYNCPG_QUERY - {"sslmode"})
            if unknown:
                raise ValueError(f"unknown connection parameter {unknown[0]!r} in the URL (asyncpg takes "
                                 f"{', '.join(sorted(_ASYNCPG_QUERY))}; sslmode is read as ssl)")
            for name, allowed in _ASYNCPG_VALUES.items():
                for given in (url.query.get(name), url.query.get("sslmode") if name == "ssl" else None):
                    if given is not None and (not isinstance(given, str) or given not in allowed):
                        raise ValueError(f"{'ssl' if name == 'ssl' else name} must be one of "
                                         f"{', '.join(sorted(allowed))}, not {given!r}")
        if url.drivername in ("postgresql+asyncpg", "sqlite+aiosqlite") and "sslmode" not in url.query \
                and value.strip().startswith(url.drivername):
            return value  # (as written: a URL rendered again may escape characters of a path)
        if backend in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+asyncpg")
            if "sslmode" in url.query:
                mode = url.query["sslmode"]
                url = url.difference_update_query(["sslmode"])
                if "ssl" not in url.query:
                    url = url.update_query_dict({"ssl": mode})
        elif backend == "sqlite":
            url = url.set(drivername="sqlite+aiosqlite")
        else:
            raise ValueError(f"the {backend!r} database is not supported: use PostgreSQL "
                             "(postgresql+asyncpg://user:pass@host/db) or SQLite (sqlite+aiosqlite:///path)")
        return url.render_as_string(hide_password=False)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        """A URL redis-py reads as written. redis-py skips a database number it cannot read
        ("redis://host:6379/l2", "/99x") and uses database 0 without a word, where another
        deployment's tenants may live (found by QA)."""
        if value is None or not value.strip():
            return None
        value = value.strip()
        example = "(e.g. redis://127.0.0.1:6379/0, rediss://user:pass@host:6380/2, unix:///run/redis.sock?db=1)"
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises on a port that is not a number or out of range
        except ValueError:  # (its text may quote a password cut at a '#', '/' or '?': a review's find)
            raise ValueError("not a Redis URL: no port number after the host (a password holding '#', '/', '?' "
                             f"or '@' must be percent-encoded) {example}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: the scheme must be redis://, rediss:// or unix:// {example}")
        db = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
        if scheme != "unix" and parts.path.strip("/"):
            db.append(unquote(parts.path).strip("/"))
        for given in db:
            if not (given.isascii() and given.isdigit()):
                raise ValueError(f"the Redis database must be a number, not {given!r} {example}")
        if len(set(map(int, db))) > 1:
            raise ValueError(f"the Redis URL names two databases ({', '.join(db)}) {example}")
        return value

    @field_validator("admin_jwks_url")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        """https://, a file, or http:// on this machine only: signing keys fetched in clear from
        another host could be replaced on the way, and with them any admin token (found by QA)."""
        value = value.strip() if value else value
        if value and value.lower().startswith("http://"):
            if not is_loopback(urlsplit(value).hostname or ""):
                raise ValueError("an http:// key set from another host could be replaced on its way, and with it "
                                 "any admin token: use https:// (http:// is taken for 127.0.0.1 and localhost)")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: str) -> str:
        """Each entry an address, a network or "*" (found by QA: a typo was taken, and silently
        trusted no proxy)."""
        for entry in (e.strip() for e in value.split(",")):
            if entry and entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"{entry!r} is not an address, a network (10.0.0.0/8) or *") from None
        return value

    @model_validator(mode="after")
    def _under_data_dir(self) -> Settings:
        """Moves the local defaults under ``data_dir`` when it is set and they are not."""
        if "data_dir" not in self.model_fields_set:
            return self
        database = URL.create("sqlite+aiosqlite", database=os.path.join(self.data_dir, "pagegate.db"))
        derived = {  # (the URL escapes a "?" or "%" of the path, found by QA: "d?x" made a file "d")
            "database_url": database.render_as_string(hide_password=False),
            "usage_spool_dir": os.path.join(self.data_dir, "usage-spool"),
            "weights_cache_dir": os.path.join(self.data_dir, "weights"),
        }
        for name, value in derived.items():
            if name not in self.model_fields_set:
                setattr(self, name, value)
        return self

    @property
    def placeholder_admin_secret(self) -> bool:
        """Whether ``admin_jwt_secret`` is still the built-in placeholder (public: it is in the source)."""
        return self.admin_jwt_secret == type(self).model_fields["admin_jwt_secret"].default

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            served_model_name=self.served_model_name,
            weights_cache_dir=self.weights_cache_dir,
            device=self.device,
            dtype=self.dtype,
            block_size=self.block_size,
            kv_cache_memory_gb=self.kv_cache_memory_gb,
            num_blocks=self.num_blocks,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_waiting=self.max_waiting,
            max_waiting_per_class=self.max_waiting_per_tenant,
            admission_gap_ms=self.admission_gap_ms,
            admission_max_wait_ms=self.admission_max_wait_ms,
            admission_notice_gap_ms=self.admission_notice_gap_ms,
            enable_prefix_caching=self.enable_prefix_caching,
            attention_backend=self.attention_backend,
            linear_backend=self.linear_backend,
            num_threads=self.num_threads,
        )


LOG_LEVELS = {"critical": 50, "error": 40, "warning": 30, "info": 20, "debug": 10, "trace": 5}  # trace: uvicorn's


def python_log_level(settings: Settings) -> int:
    """``logging``'s number for ``settings.log_level`` (uvicorn's "trace" is 5, below debug)."""
    return LOG_LEVELS[settings.log_level]


def settings_errors(exc: ValidationError) -> str:
    """A ``Settings()`` refusal in one line, each wrong setting by its variable: what ``pagegate
    serve`` and ``pagegate generate`` print after ``error: invalid settings:``."""
    return "; ".join(f"PAGEGATE_{'_'.join(map(str, e['loc'])).upper()}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors())


# PAGEGATE_* variables that are not settings of this class but are read on purpose: the CPU
# kernels' cache directory (``kernels/native.py``) and the test suite's PAGEGATE_TEST_*
_OTHER_VARIABLES = frozenset({"PAGEGATE_KERNEL_CACHE"})


def miscased_settings(environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Variables that name a setting in another case than capitals (``PAGEGATE_Port``), each with
    its name in capitals. Settings are read in any case, so such a variable is used, and with the
    capitals one also set, which one wins is not defined: ``pagegate serve`` and the admin CLI refuse
    them (found by QA: ``PAGEGATE_Port`` was said to be ignored, then used over ``PAGEGATE_PORT``)."""
    env = os.environ if environ is None else environ
    known = {f"PAGEGATE_{name.upper()}" for name in Settings.model_fields}
    return [(name, name.upper()) for name in sorted(env) if name != name.upper() and name.upper() in known]


def miscased_refusal(environ: dict[str, str] | None = None) -> str | None:
    """What ``pagegate serve`` and the admin CLI say after ``error:`` when ``miscased_settings``
    finds any; None when there is none."""
    miscased = miscased_settings(environ)
    if not miscased:
        return None
    return "; ".join(f"{name}: write it {upper} (a setting's name is in capitals)" for name, upper in miscased)


def unknown_settings(environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """The ``PAGEGATE_*`` variables that name no setting, each with the setting it most likely
    meant (None when none is close): a misspelt one used to be ignored in silence (found by QA)."""
    import difflib

    env = os.environ if environ is None else environ
    known = sorted(f"PAGEGATE_{name.upper()}" for name in Settings.model_fields)
    out = []
    for name in sorted(env):
        if not name.startswith("PAGEGATE_") or name in _OTHER_VARIABLES or name.startswith("PAGEGATE_TEST_"):
            continue
        if name not in known and name.upper() not in known:  # (a setting in another case: ``miscased_settings``)
            close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.8)  # (in any case: QA)
            out.append((name, close[0] if close else None))
    return out

