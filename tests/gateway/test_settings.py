"""Settings read from the environment: the local defaults follow ``PAGEGATE_DATA_DIR``."""

from __future__ import annotations

import pytest

from gateway.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):  # noqa: ANN001
    import os

    for name in list(os.environ):
        if name.startswith("PAGEGATE_"):
            monkeypatch.delenv(name)


def test_the_defaults_are_under_dot_data() -> None:
    s = Settings()
    assert s.database_url == "sqlite+aiosqlite:///./data/pagegate.db"
    assert (s.usage_spool_dir, s.weights_cache_dir) == ("./data/usage-spool", "./data/weights")


def test_a_data_dir_moves_every_local_default(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """Found by QA: PAGEGATE_DATA_DIR moved only the embedded Redis; the SQLite database, the usage
    spool and the converted weights stayed under ./data of the working directory."""
    monkeypatch.setenv("PAGEGATE_DATA_DIR", str(tmp_path / "state"))
    s = Settings()
    assert s.database_url == f"sqlite+aiosqlite:///{tmp_path / 'state' / 'pagegate.db'}"
    assert s.usage_spool_dir == str(tmp_path / "state" / "usage-spool")
    assert s.weights_cache_dir == str(tmp_path / "state" / "weights")
    assert s.engine_config().weights_cache_dir == s.weights_cache_dir


def test_a_path_set_on_its_own_stays(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("PAGEGATE_DATA_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", "postgresql+asyncpg://u@h/db")
    monkeypatch.setenv("PAGEGATE_WEIGHTS_CACHE_DIR", "/opt/weights")
    s = Settings()
    assert s.database_url == "postgresql+asyncpg://u@h/db"
    assert s.weights_cache_dir == "/opt/weights"
    assert s.usage_spool_dir == str(tmp_path / "state" / "usage-spool")


def test_a_relative_data_dir_stays_relative(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("PAGEGATE_DATA_DIR", "var/pg")
    s = Settings()
    assert s.database_url == "sqlite+aiosqlite:///var/pg/pagegate.db"
    assert s.usage_spool_dir == "var/pg/usage-spool"


@pytest.mark.parametrize("name", ["d?x", "d%41x", "a b#c"])
def test_a_data_dir_with_url_characters_holds_the_database(monkeypatch, tmp_path, name) -> None:  # noqa: ANN001
    """Found by QA: the URL was built by string formatting, so "d?x" put the database in a file
    "d" and "d%41x" in "dAx", while the spool and the weights went to the right directory."""
    from sqlalchemy.engine import make_url

    monkeypatch.setenv("PAGEGATE_DATA_DIR", str(tmp_path / name))
    s = Settings()
    assert make_url(s.database_url).database == str(tmp_path / name / "pagegate.db")


def test_an_empty_data_dir_is_refused(monkeypatch) -> None:  # noqa: ANN001
    from pydantic import ValidationError

    monkeypatch.setenv("PAGEGATE_DATA_DIR", "")
    with pytest.raises(ValidationError):
        Settings()


def test_forwarded_allow_ips_takes_addresses_networks_or_a_star(monkeypatch) -> None:  # noqa: ANN001
    """Found by QA: a typo was taken silently, and trusted no proxy."""
    from pydantic import ValidationError

    for good in ("127.0.0.1", "10.0.0.0/8, ::1", "*", ""):
        monkeypatch.setenv("PAGEGATE_FORWARDED_ALLOW_IPS", good)
        assert Settings().forwarded_allow_ips == good
    monkeypatch.setenv("PAGEGATE_FORWARDED_ALLOW_IPS", "10.0.0.1,garbage!!")
    with pytest.raises(ValidationError, match="garbage"):
        Settings()


def test_the_log_level_is_one_of_uvicorns_in_any_case(monkeypatch) -> None:  # noqa: ANN001
    """Found by QA: "warn" and "trace" were tracebacks at start, not one ``error:`` line."""
    from pydantic import ValidationError

    from gateway.settings import python_log_level

    for given, level, number in (("warn", "warning", 30), ("DEBUG", "debug", 10), ("trace", "trace", 5)):
        monkeypatch.setenv("PAGEGATE_LOG_LEVEL", given)
        settings = Settings()
        assert (settings.log_level, python_log_level(settings)) == (level, number)
    monkeypatch.setenv("PAGEGATE_LOG_LEVEL", "loud")
    with pytest.raises(ValidationError, match="'loud' is not one of critical"):
        Settings()


@pytest.mark.parametrize("name, value", [
    ("CACHE_THRESHOLD", "1.5"), ("CACHE_THRESHOLD", "0"), ("CACHE_TTL_S", "-1"), ("CACHE_MAX_ENTRIES", "0"),
    ("USAGE_BATCH_SIZE", "0"), ("USAGE_FLUSH_INTERVAL_S", "0"), ("ADMIN_TOKEN_TTL_S", "-10"),
    ("DEFAULT_RPM", "-1"), ("IP_RPM", "-5"), ("REDIS_TIMEOUT_S", "inf"), ("DATABASE_TIMEOUT_S", "nan"),
    # found by QA: inf was taken, and then no settlement ever ran (or no usage row reached the database)
    ("SETTLE_DELAY_MS", "inf"), ("SETTLE_DELAY_MS", "nan"), ("USAGE_DB_INTERVAL_S", "inf"),
])
def test_server_defaults_out_of_range_are_refused(monkeypatch, name, value) -> None:  # noqa: ANN001
    """Found by QA: the admin API refused these per tenant while the server-wide defaults took them
    (a negative RPM meant no limit, silently; an infinite Redis timeout failed later, blaming Redis)."""
    from pydantic import ValidationError

    monkeypatch.setenv(f"PAGEGATE_{name}", value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(("given", "used"), [
    ("postgresql://postgres@127.0.0.1:5432/test", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    ("postgres://u:p%40ss@db.example/app", "postgresql+asyncpg://u:p%40ss@db.example/app"),
    ("postgresql+psycopg2://u@h/d?sslmode=require", "postgresql+asyncpg://u@h/d?ssl=require"),
    ("postgresql+asyncpg://u@h/d?sslmode=disable&ssl=prefer", "postgresql+asyncpg://u@h/d?ssl=prefer"),
    ("sqlite:////tmp/x.db", "sqlite+aiosqlite:////tmp/x.db"),
    ("sqlite+aiosqlite:///./d?x/pagegate.db", "sqlite+aiosqlite:///./d?x/pagegate.db"),  # as written
])
def test_a_database_url_is_read_with_the_async_driver(given: str, used: str) -> None:
    """Found by QA: ``postgresql://`` (the URL most users type) and ``?sslmode=require`` were
    tracebacks in the admin CLI (no psycopg; asyncpg has no ``sslmode``)."""
    assert Settings(database_url=given, load_engine=False).database_url == used


@pytest.mark.parametrize(("given", "says"), [
    ("mysql://u@h/d", "the 'mysql' database is not supported"),
    ("nonsense", "not a database URL"),
    ("postgresql://u@h/d?application_name=x", "unknown connection parameter 'application_name'"),
    # found by QA: read as host "ss@h", a DNS error whose URL showed the password's end
    ("postgresql+asyncpg://u:p@zz9@h:5432/d", "percent-encode it as %40"),
])
def test_an_unusable_database_url_is_refused_by_name(given: str, says: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        Settings(database_url=given, load_engine=False)
    assert says in err.value.errors()[0]["msg"]
    assert "zz9" not in err.value.errors()[0]["msg"]  # no part of a password in the error


def test_the_admin_cli_reads_a_plain_postgresql_url(monkeypatch, capsys, pg_url) -> None:  # noqa: ANN001
    """End to end on the PostgreSQL here (a migrated database): a plain ``postgresql://`` URL with
    libpq's ``sslmode`` lists the tenants, no traceback."""
    from admin.cli import main

    plain = pg_url.replace("postgresql+asyncpg://", "postgresql://") + "?sslmode=disable"
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", plain)
    monkeypatch.setenv("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/15")
    assert main(["tenants", "list", "--json"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("url", "taken"), [
    ("https://idp.example/.well-known/jwks.json", True), ("/etc/pagegate/jwks.json", True),
    ("file:///etc/jwks.json", True), ("http://127.0.0.1:8080/jwks", True), ("http://localhost/jwks", True),
    ("http://[::1]/jwks", True), ("http://idp.example/jwks", False), ("HTTP://10.0.0.1/jwks", False),
])
def test_an_admin_key_set_in_clear_is_taken_from_this_machine_only(url: str, taken: bool) -> None:
    """Found by QA: an http:// JWKS from another host was fetched silently; whoever sits on the path
    could hand the server their own signing key."""
    from pydantic import ValidationError

    if taken:
        assert Settings(admin_jwks_url=url, load_engine=False).admin_jwks_url == url
    else:
        with pytest.raises(ValidationError, match="use https://"):
            Settings(admin_jwks_url=url, load_engine=False)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e12"])
def test_the_gil_switch_interval_is_range_checked(monkeypatch, value: str) -> None:
    """Found by QA: -1 and nan were taken silently (as 0), 1e12 had no bound."""
    from pydantic import ValidationError

    monkeypatch.setenv("PAGEGATE_GIL_SWITCH_INTERVAL_MS", value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(("given", "says"), [
    ("postgresql://u@h/d?statement_cache_size=100", "unknown connection parameter 'statement_cache_size'"),
    ("postgresql://u@h:99999/d", "the port must be between 1 and 65535, not 99999"),
    ("postgresql://u@h/d?sslmode=bogus", "ssl must be one of"),
    ("postgresql://u@h/d?target_session_attrs=bogus", "target_session_attrs must be one of"),
])
def test_database_url_parameters_asyncpg_cannot_take_are_refused_by_name(given: str, says: str) -> None:
    """Found by a recheck QA: numbers in the query (which asyncpg got as text), a port out of range and
    values asyncpg refuses were tracebacks or driver internals at the first connect."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        Settings(database_url=given, load_engine=False)
    assert says in err.value.errors()[0]["msg"]


def test_a_database_url_scheme_is_case_insensitive() -> None:
    assert Settings(database_url="POSTGRESQL://u@h/d", load_engine=False).database_url == "postgresql+asyncpg://u@h/d"
    assert Settings(database_url="SQLite:////tmp/x.db", load_engine=False).database_url == "sqlite+aiosqlite:////tmp/x.db"


def test_a_misspelt_setting_is_named_with_the_one_it_meant() -> None:
    """Found by QA: a misspelt ``PAGEGATE_*`` variable was ignored in silence. ``pagegate serve``
    warns about each one, with the closest setting."""
    from gateway.settings import unknown_settings

    env = {"PAGEGATE_SETTLE_DELAY_M": "5", "PAGEGATE_PORT": "9000", "PAGEGATE_WHATEVER": "1",
           "PAGEGATE_KERNEL_CACHE": "/tmp/k", "PAGEGATE_TEST_PG_DSN": "x", "OTHER_PAGEGATE_X": "1"}
    assert unknown_settings(env) == [("PAGEGATE_SETTLE_DELAY_M", "PAGEGATE_SETTLE_DELAY_MS"),
                                     ("PAGEGATE_WHATEVER", None)]


def test_a_nan_cache_threshold_is_called_not_finite(monkeypatch) -> None:  # noqa: ANN001
    """Found by QA: ``PAGEGATE_CACHE_THRESHOLD=nan`` was refused as "less than or equal to 1"."""
    from pydantic import ValidationError

    monkeypatch.setenv("PAGEGATE_CACHE_THRESHOLD", "nan")
    with pytest.raises(ValidationError, match="finite number"):
        Settings()


@pytest.mark.parametrize(("given", "says"), [
    ("redis://127.0.0.1:6379/l2", "the Redis database must be a number, not 'l2'"),  # (found by QA: database 0)
    ("redis://127.0.0.1:6379/99x", "the Redis database must be a number, not '99x'"),
    ("unix:///run/redis.sock?db=one", "the Redis database must be a number, not 'one'"),
    ("redis://127.0.0.1:6379/1?db=2", "the Redis URL names two databases"),
    ("redis://127.0.0.1:63x9/1", "not a Redis URL: no port number after the host"),
    ("redis://:hunter2#x@127.0.0.1:6379/0", "must be percent-encoded"),  # (the password is not quoted)
    ("http://127.0.0.1:6379/1", "the scheme must be redis://, rediss:// or unix://"),
])
def test_an_unusable_redis_url_is_refused_by_name(given: str, says: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        Settings(redis_url=given, load_engine=False)
    assert says in err.value.errors()[0]["msg"] and "hunter2" not in err.value.errors()[0]["msg"]


@pytest.mark.parametrize("given", ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/%31", "redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/15",
                                   "rediss://app:s3cret@host:6380/2?socket_timeout=1", "unix:///run/redis.sock?db=1",
                                   "redis://h/3?db=3"])
def test_a_redis_url_redis_py_reads_as_written_is_taken(given: str) -> None:
    assert Settings(redis_url=given, load_engine=False).redis_url == given
