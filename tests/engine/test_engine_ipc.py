"""The engine behind a Unix socket (``engine.ipc``): a ``RemoteEngine`` streams the same tokens as
the engine in-process, aborts what it closes, carries the engine's errors and notices, and fails
its streams (never hangs them) when the engine's side goes away."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import threading

import pytest

from engine import ipc, json_grammar, json_schema
from engine.async_engine import AsyncEngine
from engine.ipc import EngineServer
from engine.ipc_wire import frame, loads
from engine.llm_engine import LLMEngine
from engine.outputs import (
    EngineClassFullError,
    EngineDeadError,
    EngineOverloadedError,
    EngineStats,
    EngineStoppingError,
    PromptTooLongError,
)
from engine.remote_engine import RemoteEngine
from engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


async def until(condition, timeout: float = 2.0) -> bool:  # noqa: ANN001
    """Wait (polling) until ``condition()`` holds, at most ``timeout`` seconds; its last value
    (the caller asserts it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)
    return bool(condition())


@pytest.fixture
async def served(tiny_model_dir, engine_config, tmp_path):
    """An AsyncEngine served at a socket, and a factory of RemoteEngines connected to it."""
    made: list = []

    async def make(**kw):
        cfg = engine_config(tiny_model_dir, **kw)
        eng = AsyncEngine(cfg, engine=LLMEngine(cfg), model_id="tiny")
        await eng.start()
        server = EngineServer(eng, tmp_path / f"engine{len(made)}.sock")
        await server.start()
        made.append((eng, server))
        return eng, server

    clients: list = []

    async def connect(server):
        client = RemoteEngine(server.path, connect_timeout_s=5)
        await client.start()
        clients.append(client)
        return client

    yield make, connect
    for client in clients:
        await client.shutdown()
    for eng, server in made:
        await server.close()
        await eng.shutdown()


async def collect(engine, prompt, params, rid, **kw):
    tokens, outs = [], []
    async for out in engine.generate(prompt, params, request_id=rid, **kw):
        outs.append(out)
        for d in out.deltas:
            tokens += d.token_ids
    return tokens, outs


async def test_two_fronts_stream_what_the_engine_makes(served, tiny_model_dir, engine_config):
    make, connect = served
    eng, server = await make()
    a, b = await connect(server), await connect(server)
    assert (a.model_id, a.max_model_len, a.vocab_size) == ("tiny", eng.max_model_len, eng.vocab_size)
    prompts = [list(range(i, i + 5 + 7 * i)) for i in range(6)]
    params = SamplingParams(max_tokens=12, **GREEDY)
    # the same request id from both fronts: each front has its own namespace in the engine
    results = await asyncio.gather(*(collect(a if i % 2 else b, p, params, f"r{i // 2}")
                                     for i, p in enumerate(prompts)))
    expected = LLMEngine(engine_config(tiny_model_dir)).generate(prompts, params)
    assert [r[0] for r in results] == expected
    for _, outs in results:
        assert outs[-1].finished and len(outs) >= 2 and all(not o.finished for o in outs[:-1])
    assert eng.stats().kv_blocks_used == 0 and not eng._streams


async def test_tokenizes_in_the_front_like_the_engine(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <|im_end|> there"}]
    assert client.encode_chat(messages) == eng.encode_chat(messages)
    assert client.encode("héllo") == eng.encode("héllo")
    assert client.max_waiting == eng.max_waiting  # a front refuses a prompt batch larger than it, as in-process
    tokens, _ = await collect(client, "hello", SamplingParams(max_tokens=3, **GREEDY), "s")
    direct, _ = await collect(eng, "hello", SamplingParams(max_tokens=3, **GREEDY), "d")
    assert tokens == direct


async def test_closing_the_stream_aborts_and_frees_blocks(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    agen = client.generate(list(range(1, 40)), SamplingParams(max_tokens=500, **GREEDY), request_id="long")
    first = await agen.__anext__()
    assert first.deltas
    await agen.aclose()
    assert await until(lambda: eng.stats().kv_blocks_used == 0 and not eng._streams, timeout=2)


async def test_an_id_reused_at_once_gets_only_its_own_outputs(served):
    """A stream closed while its request still runs, and a new request under the same id at once:
    the old one's outputs still on their way never reach the new stream (the engine process knows
    each by a wire id), and the new one streams exactly what a fresh id gets."""
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    params = SamplingParams(max_tokens=12, **GREEDY)
    expected = [t async for out in client.generate(list(range(1, 30)), params, request_id="fresh")
                for d in out.deltas for t in d.token_ids]
    for _ in range(3):
        agen = client.generate(list(range(1, 40)), SamplingParams(max_tokens=500, **GREEDY), request_id="again")
        await agen.__anext__()
        await agen.aclose()
        outs = [out async for out in client.generate(list(range(1, 30)), params, request_id="again")]
        assert [t for out in outs for d in out.deltas for t in d.token_ids] == expected
        assert outs[-1].finished and outs[-1].deltas[-1].finish_reason == "length"
        assert {out.request_id for out in outs} == {"again"}
    assert await until(lambda: eng.stats().kv_blocks_used == 0 and not eng._streams, timeout=2)


async def test_a_front_that_goes_away_has_its_requests_stopped(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    agen = client.generate(list(range(1, 40)), SamplingParams(max_tokens=500, **GREEDY), request_id="long")
    await agen.__anext__()
    client._conn.transport.abort()  # the front process dies with a request running
    with pytest.raises(EngineDeadError):
        await agen.__anext__()
    assert await until(lambda: not eng._streams and eng.stats().kv_blocks_used == 0, timeout=2)


async def test_errors_cross_the_socket_as_the_engines_own(served):
    make, connect = served
    eng, server = await make(max_waiting=1)
    client = await connect(server)
    with pytest.raises(PromptTooLongError) as too_long:
        await collect(client, list(range(1, 255)) * 5, SamplingParams(max_tokens=2), "x")
    assert too_long.value.max_model_len == eng.max_model_len
    with pytest.raises(ValueError, match="token ids"):
        await collect(client, [1, 10_000], SamplingParams(max_tokens=2), "y")
    # the engine's own refusal (its queue is full) comes back as the same class
    eng._waiting_by_class = {None: 5}  # as if 5 requests were waiting (idle: nothing overwrites it)
    eng._stats = dataclasses.replace(eng._stats, running=eng.config.max_num_seqs)  # and no running slot free
    with pytest.raises(EngineOverloadedError):
        await collect(client, [1, 2, 3], SamplingParams(max_tokens=2), "z")
    # a class's share of the queue: its own class, so the gateway answers 429 rather than 503
    eng._waiting_by_class = {}
    eng._class_cap = 0
    with pytest.raises(EngineClassFullError):
        await collect(client, [1, 2, 3], SamplingParams(max_tokens=2), "w", priority_class="t1")


async def test_notices_reach_the_engines_burst_gate(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    gate = eng._burst
    kept, dropped = client.announce(), client.announce()
    assert await until(lambda: gate.open_notices == 2, timeout=2)
    dropped.close()
    tokens, _ = await collect(client, [1, 2, 3], SamplingParams(max_tokens=2, **GREEDY), "n", notice=kept)
    assert len(tokens) == 2
    await asyncio.sleep(0.01)
    assert gate.open_notices == 0  # one finished request sets no expectation (see the next test)
    # a notice left open by a front that goes away is withdrawn with it
    left_open = client.announce()  # noqa: F841 - held: a dropped notice withdraws itself
    await asyncio.sleep(0.05)
    assert gate.open_notices == 1
    client._conn.transport.abort()
    assert await until(lambda: gate.open_notices == 0, timeout=2)


async def test_streams_fail_when_the_engine_side_goes_away(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    agen = client.generate(list(range(1, 40)), SamplingParams(max_tokens=500, **GREEDY), request_id="long")
    await agen.__anext__()
    await server.close()
    with pytest.raises(EngineDeadError):
        async for _ in agen:
            pass
    assert client.is_dead
    assert client.announce() is None  # never raises: generate says why
    with pytest.raises(EngineDeadError):
        await collect(client, [1, 2], SamplingParams(max_tokens=2), "after")


async def test_stats_reach_the_front(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    await collect(client, [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY), "a")
    await until(lambda: client.stats().steps == eng.stats().steps, timeout=5)
    assert client.stats().steps == eng.stats().steps >= 4


def test_the_wire_refuses_foreign_classes():
    import os

    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        loads(pickle.dumps([("x", os.system)]))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):  # requests travel as tuples
        loads(pickle.dumps([SamplingParams(max_tokens=3)]))
    stats = EngineStats(1, 2, 3, 4, 0.5, 0.5, 0.1, 0, 9, 9)
    assert loads(frame([("stats", stats, False)])[4:]) == [("stats", stats, False)]


async def test_a_front_handed_a_wave_is_waited_for_until_it_speaks(served, monkeypatch):
    """With several fronts, the engine woken by one front's wave also waits (briefly) for a front
    that was just handed a wave of finished requests: its next message ends the wait, or
    RETURN_WAIT_S does."""
    monkeypatch.setattr(ipc, "RETURN_WAIT_S", 0.5)  # long enough to look at, whatever the machine's load
    make, connect = served
    eng, server = await make()
    a, b = await connect(server), await connect(server)
    gate = eng._burst
    params = SamplingParams(max_tokens=2, **GREEDY)
    n = ipc.RETURN_MIN_FINISHED
    steps = eng.stats().steps
    await asyncio.gather(*(collect(a, [1, 2, i], params, f"a{i}") for i in range(n)),
                         *(collect(b, [4, 5, i], params, f"b{i}") for i in range(n)))
    await asyncio.sleep(0.01)  # the expectation is taken once the step's outputs are all handed over
    assert eng.stats().steps - steps == 2  # one wave: both fronts' requests finished in the same step
    assert gate.open_notices == 2  # one per front, however many requests it was handed
    notice = b.announce()  # front b speaks: its own notice replaces the expectation
    await until(lambda: any(c.notices for c in server._conns), timeout=2)
    assert gate.open_notices == 2  # a's expectation and b's notice
    assert [c.return_notice is None for c in sorted(server._conns, key=lambda c: c.prefix)] == [False, True]
    notice.close()
    assert await until(lambda: gate.open_notices == 0, timeout=2)  # a's expired


async def test_abort_by_id_ends_the_stream_with_abort(served):
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    agen = client.generate(list(range(1, 40)), SamplingParams(max_tokens=500, **GREEDY), request_id="long")
    await agen.__anext__()
    await client.abort("long")
    last = None
    async for out in agen:
        last = out
    assert last.finished and [d.finish_reason for d in last.deltas] == ["abort"]
    assert await until(lambda: eng.stats().kv_blocks_used == 0 and not eng._streams, timeout=2)


async def test_every_sampling_field_crosses_the_socket(served):
    """Parameters travel as a tuple of their fields: n, seed, stop strings, penalties, JSON mode and
    the rest give what the same request gives in-process."""
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    params = SamplingParams(n=2, temperature=0.9, top_p=0.95, top_k=50, seed=7, max_tokens=8, min_tokens=2,
                            stop=["zz"], stop_token_ids=[3], repetition_penalty=1.2, presence_penalty=0.5,
                            frequency_penalty=0.3, ignore_eos=True, logprobs=3, logit_bias={9: 4.0, 11: -100},
                            prompt_logprobs=2, json_object=True)

    async def texts(engine, rid):  # noqa: ANN001, ANN202
        by_choice: dict = {"prompt": []}
        async for out in engine.generate([5, 6, 7, 8], params, request_id=rid):
            by_choice["prompt"].append(out.prompt_logprobs)
            for d in out.deltas:
                by_choice.setdefault(d.index, []).extend(zip(d.token_ids, d.logprobs, strict=False))
        return by_choice

    remote, local = await texts(client, "r"), await texts(eng, "l")
    assert set(remote) == {"prompt", 0, 1} and remote == local  # the logprobs cross too, the prompt's
    assert all(len(top) == 3 for i in (0, 1) for _, (_, top) in remote[i])
    for i in (0, 1):  # JSON mode crossed too: each choice a JSON prefix, and not what it is without
        assert json_grammar.accepts(bytes(t for t, _ in remote[i])) is not None
    params = dataclasses.replace(params, json_object=False)
    assert await texts(eng, "plain") != local
    scored, *later = remote["prompt"]
    assert len(scored) == 4 and scored[0] is None and all(len(e[1]) == 2 for e in scored[1:])
    assert later and all(p is None for p in later)


async def test_a_schema_compiles_off_the_socket_loop_and_its_requests_still_stop_and_abort(served, monkeypatch):
    """Found by QA: the engine's process compiled each new schema on the loop every front's
    tokens cross (a large one held every stream 5 s); it now compiles on a thread first. A request
    stopped or given up while its schema compiles ends as any other."""
    make, connect = served
    eng, server = await make()
    client = await connect(server)
    gate = threading.Event()
    real = json_schema.compile_schema

    def slow(text: str):  # noqa: ANN202 - the compile held until the test lets it go
        gate.wait(5)
        return real(text)

    monkeypatch.setattr(ipc, "compile_schema", slow)
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
                         "required": ["n"]})
    params = SamplingParams(max_tokens=30, temperature=0.0, json_schema=schema)
    kept = asyncio.create_task(collect(client, [5, 6, 7], params, "kept"))
    stopped = client.generate([5, 6, 7], params, request_id="stopped")
    first = asyncio.create_task(stopped.__anext__())
    plain_tokens, _ = await asyncio.wait_for(collect(client, [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY), "p"),
                                             timeout=5)
    assert len(plain_tokens) == 4 and not kept.done()  # (the plain request went by while the schema compiled)
    await client.abort("stopped")
    gate.set()
    tokens, outs = await asyncio.wait_for(kept, timeout=10)
    text = bytes(tokens).decode(errors="replace")
    if outs[-1].deltas[-1].finish_reason == "stop":
        assert 3 <= json.loads(text)["n"] <= 7
    out = await asyncio.wait_for(first, timeout=10)
    rest = [out] + [o async for o in stopped]
    assert rest[-1].finished and rest[-1].deltas[-1].finish_reason == "abort"
    assert await until(lambda: eng.stats().kv_blocks_used == 0 and not eng._streams, timeout=2)


@pytest.mark.parametrize("where", ["front", "in-process"])
async def test_interrupt_all_ends_every_open_stream_and_frees_its_blocks(served, where):
    """A server's graceful shutdown running out (``gateway.shutdown``): each open stream raises the
    given error and its request is stopped in the engine; a front stops only its own."""
    make, connect = served
    eng, server = await make()
    front, other = await connect(server), await connect(server)
    engine = front if where == "front" else eng
    params = SamplingParams(max_tokens=500, **GREEDY)
    mine = [engine.generate(list(range(1, 30 + i)), params, request_id=f"m{i}") for i in range(2)]
    theirs = other.generate(list(range(1, 30)), params, request_id="t")
    for agen in (*mine, theirs):
        await agen.__anext__()
    assert engine.interrupt_all(EngineStoppingError("shutting down")) == (2 if where == "front" else 3)
    for agen in mine:
        with pytest.raises(EngineStoppingError):
            while True:
                await agen.__anext__()
    if where == "front":  # the other front's request runs on
        assert not (await theirs.__anext__()).finished
        await theirs.aclose()
    else:  # in-process: the engine's own streams include the fronts' (the error crosses as itself)
        with pytest.raises(EngineStoppingError):
            while True:
                await theirs.__anext__()
    assert await until(lambda: eng.stats().kv_blocks_used == 0 and not eng._streams, timeout=2)


async def test_a_draining_engine_serves_its_fronts_until_they_close(tiny_model_dir, engine_config, tmp_path):
    """``serve_engine(drain=)``: signalled with its fronts (systemd's control group), the engine
    process keeps serving them while they finish their requests, and stops once they have closed."""
    drain = asyncio.Event()
    path = tmp_path / "drain.sock"
    task = asyncio.create_task(ipc.serve_engine(engine_config(tiny_model_dir), path, drain=drain, drain_timeout_s=30))
    client = RemoteEngine(path, connect_timeout_s=30)
    await client.start()
    drain.set()
    await asyncio.sleep(0.2)
    tokens, _ = await collect(client, [1, 2, 3], SamplingParams(max_tokens=5, **GREEDY), "d")
    assert len(tokens) == 5 and not task.done()
    await client.shutdown()
    await asyncio.wait_for(task, 5)  # no front left: it returns
    quick = asyncio.Event()
    quick.set()  # set before anyone connects: it returns at once, as when its supervisor stops it
    await asyncio.wait_for(ipc.serve_engine(engine_config(tiny_model_dir), path, drain=quick), 30)
