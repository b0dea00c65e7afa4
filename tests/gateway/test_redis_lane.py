"""The pipelined connection the request path's Lua scripts run on (``gateway.redis_lane``)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from gateway import redis_lane
from gateway.redis_lane import ScriptLane, _Incomplete, _Protocol, pack, pack_fast, parse
from tests.gateway.conftest import TENANCY_REDIS_URL, free_port

ECHO = "return {ARGV[1], tonumber(ARGV[2]) * 2, {KEYS[1]}, false}"


def test_pack_and_parse():
    assert pack("EVALSHA", "ab", 1, "k", 2.5, b"\x00") == (
        b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$3\r\n2.5\r\n$1\r\n\x00\r\n")
    with pytest.raises(TypeError):
        pack("SET", "k", True)  # like redis-py: booleans are refused
    reply = b"*4\r\n:-3\r\n$-1\r\n*2\r\n+OK\r\n$4\r\na\r\nb\r\n*-1\r\n:7\r\n"
    value, pos = parse(reply)
    assert value == [-3, None, [b"OK", b"a\r\nb"], None]
    assert parse(reply, pos) == (7, len(reply))
    for cut in range(1, pos):  # any prefix of a reply is incomplete, never misread
        with pytest.raises(_Incomplete):
            parse(reply[:cut])
    err, _ = parse(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(err, NoScriptError)
    err, _ = parse(b"-ERR wrong\r\n")
    assert isinstance(err, ResponseError) and not isinstance(err, NoScriptError) and str(err) == "wrong"  # as redis-py reads it


def test_hiredis_packs_the_same_bytes():
    assert redis_lane.hiredis is not None  # a dependency: the fast path is the one that runs
    parts = ("EVALSHA", "ab", 3, "k", 2.5, b"\x00", -1, "é")
    assert pack_fast(*parts) == pack(*parts)
    with pytest.raises(TypeError):
        pack_fast("SET", "k", True)


@pytest.mark.parametrize("reader", ["hiredis", "python"])
async def test_protocol_reads_replies_split_anywhere(reader):
    """Replies fed one byte at a time reach their waiters in order, with either reader: values,
    nils, nested arrays, error replies (NOSCRIPT as NoScriptError) as exceptions."""
    proto = _Protocol()
    if reader == "python":
        proto.reader = None
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(5)]
    proto.waiters.extend(futures)
    stream = (b"*3\r\n:-3\r\n$-1\r\n*2\r\n+OK\r\n$4\r\na\r\nb\r\n"
              b"-NOSCRIPT No matching script\r\n$-1\r\n-ERR wrong\r\n:7\r\n")
    for i in range(len(stream)):
        proto.data_received(stream[i:i + 1])
    assert futures[0].result() == [-3, None, [b"OK", b"a\r\nb"]]
    assert isinstance(futures[1].exception(), NoScriptError)
    assert futures[2].result() is None
    err = futures[3].exception()
    assert isinstance(err, ResponseError) and not isinstance(err, NoScriptError) and str(err) == "wrong"  # as redis-py reads it
    assert futures[4].result() == 7
    assert not proto.waiters


@pytest.fixture
async def redis():
    client = Redis.from_url(TENANCY_REDIS_URL)
    yield client
    await ScriptLane.for_client(client).aclose()
    await client.aclose()


async def test_replies_reach_their_callers(redis, redis_prefix):
    """Hundreds of concurrent calls on one connection: each caller gets its own reply, equal to
    what redis-py returns for the same script."""
    script = redis.register_script(ECHO)
    lane = ScriptLane.for_client(redis)
    assert lane.enabled and ScriptLane.for_client(redis) is lane  # one lane per pool
    replies = await asyncio.gather(*(lane.run(script, keys=[f"{redis_prefix}k{i}"], args=[f"v{i}", i])
                                     for i in range(300)))
    assert replies == [[f"v{i}".encode(), 2 * i, [f"{redis_prefix}k{i}".encode()], None] for i in range(300)]
    assert await script(keys=[f"{redis_prefix}k5"], args=["v5", 5]) == replies[5]


async def test_loads_a_script_redis_does_not_know(redis, redis_prefix):
    script = redis.register_script(f"return '{redis_prefix}fresh'")  # a new text: unknown to Redis
    assert (await redis.script_exists(script.sha)) == [False]
    assert await ScriptLane.for_client(redis).run(script, keys=[], args=[]) == f"{redis_prefix}fresh".encode()
    assert (await redis.script_exists(script.sha)) == [True]


async def test_error_replies_raise(redis):
    lane = ScriptLane.for_client(redis)
    boom = redis.register_script("return redis.error_reply('boom')")
    with pytest.raises(ResponseError, match="boom"):
        await lane.run(boom, keys=[], args=[])
    ok = redis.register_script("return 1")
    assert await lane.run(ok, keys=[], args=[]) == 1  # the connection is still in step


async def test_cancelled_callers_do_not_desynchronise(redis):
    script = redis.register_script("return ARGV[1]")
    slow = redis.register_script("local t = redis.call('TIME'); while true do local n = redis.call('TIME'); "
                                 "if (n[1] - t[1]) * 1000000 + n[2] - t[2] > 20000 then break end end; "
                                 "return ARGV[1]")
    lane = ScriptLane.for_client(redis)
    pending = [asyncio.ensure_future(lane.run(slow, keys=[], args=[f"s{i}"])) for i in range(3)]
    await asyncio.sleep(0.005)
    for task in pending[:2]:
        task.cancel()
    after = await asyncio.gather(*(lane.run(script, keys=[], args=[f"a{i}"]) for i in range(20)))
    assert after == [f"a{i}".encode() for i in range(20)]
    assert await pending[2] == b"s2"


async def test_lost_connection_fails_pending_calls_then_reconnects(redis):
    lane = ScriptLane.for_client(redis)
    slow = redis.register_script("local t = redis.call('TIME'); while true do local n = redis.call('TIME'); "
                                 "if (n[1] - t[1]) * 1000000 + n[2] - t[2] > 50000 then break end end; return 1")
    assert await lane.run(slow, keys=[], args=[]) == 1
    call = asyncio.ensure_future(lane.run(slow, keys=[], args=[]))
    await asyncio.sleep(0.01)
    lane._proto.transport.abort()
    with pytest.raises(RedisConnectionError):
        await call
    assert await lane.run(slow, keys=[], args=[]) == 1  # a fresh connection


async def test_redis_down_is_a_redis_error():
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    script = dead.register_script("return 1")
    with pytest.raises(RedisError):
        await ScriptLane.for_client(dead).run(script, keys=[], args=[])
    await dead.aclose()


async def test_selects_the_clients_database(redis_prefix):
    other_db = Redis.from_url(TENANCY_REDIS_URL.rsplit("/", 1)[0] + "/3")
    try:
        setter = other_db.register_script("redis.call('SET', KEYS[1], ARGV[1]); return 1")
        await ScriptLane.for_client(other_db).run(setter, keys=[f"{redis_prefix}db"], args=["three"])
        assert await other_db.get(f"{redis_prefix}db") == b"three"
        await other_db.delete(f"{redis_prefix}db")
    finally:
        await ScriptLane.for_client(other_db).aclose()
        await other_db.aclose()


def test_tls_and_other_setups_stay_on_redis_py():
    assert not ScriptLane(Redis.from_url("rediss://127.0.0.1:6390/0")).enabled
    assert ScriptLane(Redis.from_url("unix:///tmp/redis.sock?db=2")).enabled


def test_a_lane_goes_with_its_pool():
    import gc
    import weakref

    client = Redis.from_url(TENANCY_REDIS_URL)
    lane = weakref.ref(ScriptLane.for_client(client))
    del client
    gc.collect()
    assert lane() is None


async def test_a_redis_that_stops_answering_is_a_timeout_not_a_hang():
    """A server that accepts and reads but never replies (a stopped or wedged Redis): the calls
    waiting on it fail with redis-py's TimeoutError after the pool's socket_timeout, and the next
    call starts on a fresh connection."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    connections: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
    script = client.register_script("return 1")
    lane = ScriptLane.for_client(client)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        calls = [asyncio.ensure_future(lane.run(script, keys=[], args=[i])) for i in range(5)]
        for call in calls:
            with pytest.raises(RedisTimeoutError):
                await call
        assert 0.25 < loop.time() - t0 < 3  # (a bound on the test's own wait, not a speed claim)
        with pytest.raises(RedisTimeoutError):
            await lane.run(script, keys=[], args=[])
        assert len(connections) == 2  # the mute connection was dropped and a new one made
    finally:
        await lane.aclose()
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_replies_that_keep_coming_keep_the_connection(redis):
    """The timeout is for silence, not for a busy connection: many calls over longer than the
    timeout all succeed while replies keep arriving."""
    client = Redis(connection_pool=redis.connection_pool.__class__.from_url(TENANCY_REDIS_URL, socket_timeout=0.2))
    script = client.register_script("return ARGV[1]")
    lane = ScriptLane.for_client(client)
    try:
        for i in range(40):
            assert await lane.run(script, keys=[], args=[i]) == str(i).encode()
            await asyncio.sleep(0.01)
    finally:
        await lane.aclose()
        await client.aclose()


def test_a_call_on_a_lost_connection_fails_at_once():
    """Found by QA: a command sent on a connection already reset got a reply future nobody would
    ever resolve (the watchdog skips lost connections); during the reconnect's SELECT that held the
    connect lock for good, and every later call hung behind it, Redis back or not."""
    proto = _Protocol(timeout_s=1.0)

    async def go() -> None:
        proto.connection_lost(ConnectionResetError("reset by peer"))
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(proto.send(b"PING\r\n"), 1)

    asyncio.run(go())


class _Proxy:
    """A TCP front for Redis that can reset every connection it accepts ("reset"), answer nothing
    ("mute"), pass the commands on and drop the replies ("deaf": Redis runs them, nobody hears)
    or pass the bytes on ("pass")."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.mode, self.tasks = target, "pass", set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.transport.abort()
            return
        if self.mode == "mute":
            while await reader.read(65536):
                pass
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while data := await src.read(65536):
                    if not (replies and self.mode == "deaf"):
                        dst.write(data)
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True), return_exceptions=True)


async def test_redis_resetting_or_mute_fails_every_caller_and_the_lane_recovers(redis_prefix):
    """Found by QA through a proxy that reset connections for 10 s: every /v1 call hung for good.
    Reset: every call fails at once. Mute (accepts, never answers): the callers waiting on one
    connection attempt fail together when it times out (each used to wait out its own attempt
    behind the others: 1, 2, 3, ... s). Back to normal: the next call works."""
    from urllib.parse import urlparse

    target = urlparse(TENANCY_REDIS_URL)
    proxy = _Proxy((target.hostname, target.port or 6379))
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Redis.from_url(f"redis://127.0.0.1:{port}/1", socket_timeout=0.5, socket_connect_timeout=0.5)
    script = client.register_script("return ARGV[1]")
    lane = ScriptLane.for_client(client)
    loop = asyncio.get_running_loop()
    try:
        assert await lane.run(script, keys=[], args=["up"]) == b"up"
        proxy.mode = "reset"
        lane._proto.transport.abort()  # the live connection goes too, as a restarting Redis drops it
        for _ in range(3):
            calls = [asyncio.ensure_future(lane.run(script, keys=[], args=[i])) for i in range(20)]
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
            assert all(isinstance(r, RedisError) for r in results), results
        proxy.mode = "mute"
        t0 = loop.time()
        calls = [asyncio.ensure_future(lane.run(script, keys=[], args=[i])) for i in range(10)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        assert all(isinstance(r, RedisError) for r in results), results
        assert loop.time() - t0 < 3  # one attempt's timeout (0.5 s) for all ten; one each in turn took 5 s
        proxy.mode = "pass"
        assert await asyncio.wait_for(lane.run(script, keys=[], args=["back"]), 5) == b"back"
    finally:
        await lane.aclose()
        await client.aclose()
        server.close()


def test_error_replies_are_redis_pys_own_classes():
    """Found by QA: every error reply was a ResponseError, so ``LOADING`` (Redis restarting; redis-py's
    BusyLoadingError, a ConnectionError) was taken for a bad script and the settlement dropped."""
    from redis.exceptions import BusyLoadingError, NoScriptError, ReadOnlyError, ResponseError

    from gateway.redis_lane import _Protocol, parse

    cases = [(b"-LOADING Redis is loading the dataset in memory\r\n", BusyLoadingError),
             (b"-READONLY You can't write against a read only replica.\r\n", ReadOnlyError),
             (b"-NOSCRIPT No matching script.\r\n", NoScriptError), (b"-ERR unknown command\r\n", ResponseError)]
    for reply, cls in cases:
        value, _ = parse(reply)
        assert type(value) is cls, (reply, value)
    loop = asyncio.new_event_loop()
    try:
        for hiredis in (True, False):
            proto = _Protocol()
            if not hiredis:
                proto.reader = None
            waiters = [loop.create_future() for _ in cases]
            proto.waiters.extend(waiters)
            proto.data_received(b"".join(reply for reply, _ in cases))
            assert [type(w.exception()) for w in waiters] == [cls for _, cls in cases]
    finally:
        loop.close()
