"""``pagegate serve`` with a start-up dependency it cannot use: one ``error:`` line on stderr naming
it (passwords hidden), no traceback, exit status 1, and all before the engine loads (the engine is
left on here: a check that came after it would take seconds and end in uvicorn's exit status 3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.serve import safe_redis_url

REPO = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/15"  # the test Redis: reachable


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp: Path, port: int, *args: str, **settings: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEGATE_")}
    env.update(PAGEGATE_DATABASE_URL=f"sqlite+aiosqlite:///{tmp / 'pg.db'}", PAGEGATE_DATA_DIR=str(tmp / "data"),
               PAGEGATE_USAGE_SPOOL_DIR=str(tmp / "spool"), PAGEGATE_CACHE_ENABLED="false",
               PAGEGATE_LOG_LEVEL="warning")
    env.update(settings)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    return proc, time.monotonic() - started


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["redis-unreachable", "redis-malformed", "redis-db-typo", "spool-under-a-file",
                                  "data-dir-under-a-file", "bad-setting", "empty-spool-dir", "miscased-setting", "worker-index",
                                  "unknown-model", "bad-engine-setting", "admission-wait",
                                  "max-model-len", "max-waiting", "bad-device", "kv-beyond-memory", "long-model-id",
                                  "triton-on-cpu", pytest.param("no-cuda", marks=pytest.mark.skipif(
                                      _cuda_available(), reason="this machine has a CUDA GPU"))])
def test_an_unusable_dependency_is_one_line_and_exit_1(tmp_path, case) -> None:  # noqa: ANN001
    (tmp_path / "file").write_text("not a directory")
    settings, expected = {
        "redis-unreachable": ({"PAGEGATE_REDIS_URL": f"redis://:hunter2@127.0.0.1:{free_port()}/0"},
                              "error: cannot use Redis at redis://:***@127.0.0.1:"),
        "redis-malformed": ({"PAGEGATE_REDIS_URL": "foo://bar"},
                            "error: invalid settings: PAGEGATE_REDIS_URL: not a Redis URL: the scheme must be"),
        # (found by QA: redis-py reads "/l2" as no database, and database 0 was used without a word)
        "redis-db-typo": ({"PAGEGATE_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/l2"},
                          "error: invalid settings: PAGEGATE_REDIS_URL: the Redis database must be a number, not 'l2'"),
        "spool-under-a-file": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_USAGE_SPOOL_DIR": str(tmp_path / "file/spool")},
                               f"error: cannot use the usage spool directory {tmp_path / 'file/spool'}: "),
        "data-dir-under-a-file": ({"PAGEGATE_DATA_DIR": str(tmp_path / "file/data")},  # no Redis URL: embedded
                                  f"error: cannot start the embedded Redis in {tmp_path / 'file/data/redis'}: "),
        "bad-setting": ({"PAGEGATE_REDIS_TIMEOUT_S": "soon"}, "error: invalid settings: PAGEGATE_REDIS_TIMEOUT_S: "),
        # (found by QA: an empty spool directory was the working directory, whose files it adopted
        # or set aside; a setting in another case was said to be ignored, then used)
        "empty-spool-dir": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_USAGE_SPOOL_DIR": ""},
                            "error: invalid settings: PAGEGATE_USAGE_SPOOL_DIR: String should have at least 1"),
        "miscased-setting": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_Port": "1"},
                             "error: PAGEGATE_Port: write it PAGEGATE_PORT"),
        "worker-index": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_WORKER_INDEX": "zz"},
                         "error: PAGEGATE_WORKER_INDEX is set: `pagegate serve --workers N` sets it"),
        "admission-wait": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_ADMISSION_NOTICE_GAP_MS": "-1"},
                           "error: cannot use the engine's settings: PAGEGATE_ADMISSION_NOTICE_GAP_MS must be a"),
        "unknown-model": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_MODEL": str(tmp_path / "no-such-model")},
                          f"error: cannot use the engine's settings: unknown model '{tmp_path / 'no-such-model'}'"),
        "bad-engine-setting": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_BLOCK_SIZE": "7"},
                               "error: cannot use the engine's settings: PAGEGATE_BLOCK_SIZE must be one of"),
        "max-model-len": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_MAX_MODEL_LEN": "-5"},
                          "error: cannot use the engine's settings: PAGEGATE_MAX_MODEL_LEN must be >= 2"),
        "max-waiting": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_MAX_WAITING": "-1"},
                        "error: cannot use the engine's settings: PAGEGATE_MAX_WAITING must be >= 1"),
        "bad-device": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_DEVICE": "bogus"},
                       "error: cannot use the engine's settings: PAGEGATE_DEVICE must be auto, cpu, cuda or cuda:N"),
        # (found by QA: 200 GiB got the process OOM-killed, 1e9 never finished sizing its free list)
        "kv-beyond-memory": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_KV_CACHE_MEMORY_GB": "1e9",
                              "PAGEGATE_DEVICE": "cpu"},
                             "error: cannot use the engine's settings: a KV cache of 1,000,000,000.0 GiB "
                             "(PAGEGATE_KV_CACHE_MEMORY_GB) does not fit the "),
        # (found by QA: a usage row holds 128 characters of it, and every row would have been refused)
        "long-model-id": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_SERVED_MODEL_NAME": "m" * 129},
                          "error: cannot use the engine's settings: the served model id 'mmmm"),
        # (found by QA: an engine built, then failed at the first request, for every request)
        "triton-on-cpu": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_ATTENTION_BACKEND": "triton", "PAGEGATE_DEVICE": "cpu",
                           "TRITON_INTERPRET": "0"},
                          "error: cannot use the engine's settings: PAGEGATE_ATTENTION_BACKEND 'triton' cannot run on cpu"),
        "no-cuda": ({"PAGEGATE_REDIS_URL": REDIS, "PAGEGATE_DEVICE": "cuda"},
                    "error: cannot use the engine's settings: PAGEGATE_DEVICE 'cuda', but this torch sees no CUDA GPU"),
    }[case]
    proc, elapsed = _serve(tmp_path, free_port(), **settings)
    line = _one_error_line(proc)
    assert line.startswith(expected), line
    assert "hunter2" not in proc.stderr + proc.stdout
    assert elapsed < 30  # the engine was not loaded (nor the app built)


def test_a_database_that_accepts_and_never_answers_fails_after_the_timeout(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: a PostgreSQL behind a proxy that accepts connections and forwards nothing held
    the start 64 s whatever PAGEGATE_DATABASE_TIMEOUT_S said (the migration's connect used asyncpg's
    own 60 s)."""
    import threading

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(mute.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        url = f"postgresql+asyncpg://pagegate:secret@127.0.0.1:{mute.getsockname()[1]}/pagegate"
        proc, elapsed = _serve(tmp_path, free_port(), PAGEGATE_REDIS_URL=REDIS, PAGEGATE_DATABASE_URL=url,
                               PAGEGATE_DATABASE_TIMEOUT_S="1")
    finally:
        mute.close()
        for conn in held:
            conn.close()
    line = _one_error_line(proc)
    assert line.startswith("error: cannot prepare the database at postgresql+asyncpg://pagegate:***@"), line
    assert "secret" not in proc.stderr and elapsed < 30  # (64 s before: asyncpg's connect default)


def test_a_port_in_use_fails_before_the_engine_loads(tmp_path) -> None:  # noqa: ANN001
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, elapsed = _serve(tmp_path, port, PAGEGATE_REDIS_URL=REDIS)
    assert _one_error_line(proc) == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert elapsed < 30
    assert not (tmp_path / "pg.db").exists()  # failed before the database was touched


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
    ("redis://app:s3cret@host/0?socket_timeout=1", "redis://app:***@host/0?socket_timeout=1"),
    ("unix:///run/redis.sock?db=0&password=s3cret", "unix:///run/redis.sock?db=0&password=***"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("localhost:6379", "localhost:6379"),  # not a URL redis-py takes, shown as given
    ("redis://:s3cret@[::1:6379/0", "(an unparsable URL)"),
])
def test_safe_redis_url_hides_the_password(url: str, shown: str) -> None:
    assert safe_redis_url(url) == shown


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+asyncpg://u:s3cret@h/db", "postgresql+asyncpg://u:***@h/db"),
    # found by QA: a password given as a query parameter was printed in clear
    ("postgresql+asyncpg://u@h:5999/db?password=s3cret&ssl=require", "postgresql+asyncpg://u@h:5999/db?password=***&ssl=require"),
    ("postgresql+asyncpg://u@h/db?sslpassword=s3cret", "postgresql+asyncpg://u@h/db?sslpassword=***"),
    ("sqlite+aiosqlite:///./data/pagegate.db", "sqlite+aiosqlite:///./data/pagegate.db"),
    # unparsable (a port that is no number): what looks like a password is hidden all the same
    ("postgresql+asyncpg://u:s3cret@h:abc/db", "postgresql+asyncpg://u:***@h:abc/db"),
    ("postgresql+asyncpg://u@[::1/db?Password=s3cret&x=1", "postgresql+asyncpg://u@[::1/db?Password=***&x=1"),
    # an unescaped '@' in the password: the whole user part hidden (it showed "***@ss@h")
    ("postgresql+asyncpg://u:p@ss@h:5432/db", "postgresql+asyncpg://***@h:5432/db"),
])
def test_safe_database_url_hides_the_password(url: str, shown: str) -> None:
    from gateway.db.session import safe_url

    assert safe_url(url) == shown


def test_a_port_out_of_range_is_refused_not_wrapped(tmp_path) -> None:  # noqa: ANN001
    proc, _ = _serve(tmp_path, 70000, PAGEGATE_REDIS_URL=REDIS)  # getaddrinfo alone would bind 70000 - 65536
    assert _one_error_line(proc) == "error: cannot listen on 127.0.0.1:70000: a port is between 1 and 65535"


def test_port_0_given_on_the_command_line_is_refused_not_ignored(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: ``--port 0`` was read as not given (PAGEGATE_PORT, else 8000, was served), and
    PAGEGATE_PORT=0 printed a dev banner naming port 0."""
    proc, _ = _serve(tmp_path, 0, PAGEGATE_REDIS_URL=REDIS, PAGEGATE_PORT=str(free_port()))
    assert _one_error_line(proc).startswith("error: cannot listen on 127.0.0.1:0: name the port to serve on")


def test_an_engine_socket_set_by_hand_is_refused_at_once(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: the start-up waited for an engine at that socket for 10 minutes, deaf to signals."""
    proc, took = _serve(tmp_path, free_port(), PAGEGATE_REDIS_URL=REDIS, PAGEGATE_ENGINE_SOCKET=str(tmp_path / "x"))
    assert _one_error_line(proc).startswith("error: PAGEGATE_ENGINE_SOCKET is set") and took < 60


@pytest.mark.parametrize("workers", [(), ("--workers", "2")])
def test_an_engine_that_cannot_load_is_one_line_and_exit_1(tmp_path, workers) -> None:  # noqa: ANN001
    """A model that passes the checks before start-up but cannot load (here a weights file that is
    not safetensors) fails inside the app's start-up: uvicorn reports the exception's line, not
    Starlette's traceback, and ``pagegate serve`` exits 1 like the checks (uvicorn's own status is 3).
    With ``--workers`` the engine's own process reports it the same way (it printed a traceback)."""
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_text("not safetensors")
    proc, _ = _serve(tmp_path, free_port(), *workers, PAGEGATE_REDIS_URL=REDIS, PAGEGATE_MODEL=str(model))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr, proc.stderr
    failures = [line for line in proc.stderr.splitlines() if "cannot start the gateway: " in line]
    assert len(failures) == 1, proc.stderr


@pytest.mark.parametrize(("host", "refused"), [
    ("127.0.0.1", False), ("localhost", False), ("::1", False), ("[::1]", False), ("127.0.0.2", False),
    ("localhost.", False), ("::ffff:127.0.0.1", False),
    ("0.0.0.0", True), ("::", True), ("192.0.2.7", True), ("gateway.example", True),
])
def test_dev_mode_with_the_public_secret_listens_on_loopback_only(host: str, refused: bool) -> None:
    """Found by QA: ``--dev --host 0.0.0.0`` let anyone who reached the port sign an admin:write
    token with the built-in (public) secret. With a secret of one's own it may listen anywhere."""
    from gateway.serve import StartupError, check_dev_mode
    from gateway.settings import Settings

    dev = Settings(load_engine=False, dev_mode=True, host=host)
    if refused:
        with pytest.raises(StartupError, match="built-in secret, which is public"):
            check_dev_mode(dev)
    else:
        check_dev_mode(dev)
    check_dev_mode(dev.model_copy(update={"admin_jwt_secret": "x" * 40}))
    check_dev_mode(dev.model_copy(update={"dev_mode": False}))


@pytest.mark.parametrize(("host", "origin"), [
    ("0.0.0.0", "http://127.0.0.1:8123"), ("::", "http://[::1]:8123"), ("::1", "http://[::1]:8123"),
    ("127.0.0.1", "http://127.0.0.1:8123"), ("gateway.example", "http://gateway.example:8123"),
])
def test_the_dev_banner_names_an_address_a_client_can_call(host: str, origin: str) -> None:
    """Found by QA: the banner told users to curl http://0.0.0.0:PORT."""
    from gateway.serve import client_origin, dev_banner
    from gateway.settings import Settings

    settings = Settings(load_engine=False, host=host, port=8123)
    assert client_origin(settings) == origin
    assert f"{origin}/v1/chat/completions" in dev_banner(settings, "pg-KEY")
    # without an engine its chat example answers 404: the banner says so (found by QA)
    assert "no chat model is loaded" in dev_banner(settings, "pg-KEY")
    assert "no chat model is loaded" not in dev_banner(settings.model_copy(update={"load_engine": True}), "pg-KEY")


@pytest.mark.parametrize(("name", "says"), [
    ("all-MiniLM-L6-v2", None), ("sentence-transformers/all-MiniLM-L6-v2", None),
    ("/nonexistent/model", "no such directory"), ("./models/x", "no such directory"),
    ("/tmp", "holds no transformers model"), ("{bogus}", "holds no transformers model"),
    ("some-org/not-downloaded-model", "not in the Hugging Face cache"),
    ("", "not a directory nor a model name"), ("bad name!", "not a directory nor a model name"),
    ("a--b", "not a directory nor a model name"),
])
def test_an_unusable_embedding_model_is_refused_at_start(monkeypatch, tmp_path, name, says) -> None:  # noqa: ANN001
    """Found by QA: a wrong PAGEGATE_EMBEDDING_MODEL started, then every embedding was a 500; a
    recheck found a folder with any config.json passing, and bad names as tracebacks."""
    from gateway.serve import StartupError, check_embedding_model
    from gateway.settings import Settings

    (tmp_path / "config.json").write_text('{"foo": 1}')
    name = name.replace("{bogus}", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = Settings(load_engine=False, embedding_model=name)
    if says is None:
        check_embedding_model(settings)
    else:
        with pytest.raises(StartupError, match=says):
            check_embedding_model(settings)


def test_api_keys_sent_in_a_url_stay_out_of_the_access_log() -> None:
    """Found by a security QA: ``GET /v1/models?api_key=pg-…`` (refused, 401) wrote the key to
    uvicorn's access log."""
    import logging

    from gateway.serve import RedactKeys, redact_access_log

    key = "pg-" + "A1b2_C3d4-" * 4
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", f"/v1/models?api_key={key}", "1.1", 401), None)
    assert RedactKeys().filter(record)
    assert key not in record.getMessage() and "api_key=pg-***" in record.getMessage()
    # percent-encoded, in part or whole (found by a security QA: written in full)
    from urllib.parse import quote

    whole = "".join(f"%{b:02X}" for b in key.encode())
    for sent in (key.replace("-", "%2D", 1), whole, quote(key, safe="")):
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                   ("127.0.0.1:5000", "GET", f"/v1/models?x=%20&api_key={sent}", "1.1", 401), None)
        assert RedactKeys().filter(record)
        message = record.getMessage()
        assert sent not in message and key[3:] not in message and "pg-***" in message, message
    access = logging.getLogger("uvicorn.access")  # what `pagegate serve` and each worker install
    before = list(access.filters)
    try:
        redact_access_log()
        redact_access_log()  # (once)
        assert sum(isinstance(f, RedactKeys) for f in access.filters) == 1
    finally:
        access.filters[:] = before
