"""AsyncEngine: streaming on its own thread, abort by closing or by id, errors, crash safety."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.outputs import EngineClassFullError, EngineDeadError, EngineOverloadedError, PromptTooLongError
from engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture
async def make_engine(tiny_model_dir, engine_config):
    engines = []

    async def make(**kw):
        cfg = engine_config(tiny_model_dir, **kw)
        eng = AsyncEngine(cfg, engine=LLMEngine(cfg), model_id="tiny")
        await eng.start()
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        await eng.shutdown()


async def collect(engine, prompt, params, rid, **kw):
    tokens, text, outs = [], "", []
    async for out in engine.generate(prompt, params, request_id=rid, **kw):
        outs.append(out)
        for d in out.deltas:
            tokens += d.token_ids
            text += d.text
    return tokens, text, outs


async def test_streams_concurrently_like_the_sync_engine(make_engine, tiny_model_dir, engine_config):
    eng = await make_engine()
    prompts = [list(range(i, i + 5 + 7 * i)) for i in range(6)]
    params = SamplingParams(max_tokens=12, **GREEDY)
    results = await asyncio.gather(*(collect(eng, p, params, f"r{i}") for i, p in enumerate(prompts)))
    expected = LLMEngine(engine_config(tiny_model_dir)).generate(prompts, params)
    assert [r[0] for r in results] == expected
    for _, _, outs in results:
        assert outs[-1].finished and all(not o.finished for o in outs[:-1])
        assert len(outs) >= 2  # streamed as deltas, not in one piece
    assert threading.current_thread() is not eng._thread
    assert eng.stats().kv_blocks_used == 0


async def test_event_loop_stays_free_while_generating(make_engine):
    eng = await make_engine()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    t = asyncio.create_task(ticker())
    tokens, _, _ = await collect(eng, list(range(60)), SamplingParams(max_tokens=40, **GREEDY), "busy")
    t.cancel()
    assert len(tokens) == 40 and ticks > 10


async def test_closing_the_stream_aborts_and_frees_blocks(make_engine):
    eng = await make_engine()
    gen = eng.generate(list(range(40)), SamplingParams(max_tokens=500, **GREEDY), request_id="gone")
    await gen.__anext__()
    await gen.__anext__()
    assert eng.engine.kv.num_used_blocks > 0
    await gen.aclose()
    for _ in range(500):
        if not eng.engine.requests and eng.engine.kv.num_used_blocks == 0:
            break
        await asyncio.sleep(0.01)
    assert not eng.engine.requests and eng.engine.kv.num_used_blocks == 0


async def test_an_id_is_free_again_only_once_its_old_request_left_the_engine(make_engine):
    """A stream closed early leaves its request in the engine until the step thread applies the
    abort: a new request under the same id is refused until then (it would get the old one's
    outputs and its "abort"), and runs as any other afterwards."""
    eng = await make_engine()
    params = SamplingParams(max_tokens=12, **GREEDY)
    expected, _, _ = await collect(eng, list(range(20)), params, "fresh")
    gen = eng.generate(list(range(20)), SamplingParams(max_tokens=500, **GREEDY), request_id="again")
    await gen.__anext__()
    with eng._cv:  # the step thread cannot take the abort meanwhile
        await gen.aclose()
        with pytest.raises(ValueError, match="already in use"):
            await eng.generate([1, 2], params, request_id="again").__anext__()
    for _ in range(500):
        if not eng._retiring:
            break
        await asyncio.sleep(0.01)
    assert "again" not in eng.engine.requests
    tokens, _, outs = await collect(eng, list(range(20)), params, "again")
    assert tokens == expected and outs[-1].deltas[-1].finish_reason == "length"
    assert all(not o.finished for o in outs[:-1])


async def test_cancelling_the_consumer_aborts(make_engine):
    eng = await make_engine()
    task = asyncio.create_task(collect(eng, list(range(30)), SamplingParams(max_tokens=500, **GREEDY), "cancel"))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):
        if not eng.engine.requests:
            break
        await asyncio.sleep(0.01)
    assert not eng.engine.requests and eng.engine.kv.num_used_blocks == 0


async def test_abort_by_id_ends_the_stream(make_engine):
    eng = await make_engine()
    outs = []
    async for out in eng.generate([1, 2, 3], SamplingParams(max_tokens=500, **GREEDY), request_id="x"):
        outs.append(out)
        if len(outs) == 2:
            await eng.abort("x")
    assert outs[-1].finished and outs[-1].deltas[-1].finish_reason == "abort"


async def test_errors_before_the_first_yield(make_engine):
    eng = await make_engine(max_model_len=16)
    with pytest.raises(PromptTooLongError):
        await eng.generate(list(range(16)), SamplingParams(), request_id="long").__anext__()
    with pytest.raises(ValueError):
        await eng.generate([eng.vocab_size], SamplingParams(), request_id="oov").__anext__()
    eng.config.max_waiting = 0
    eng.config.max_num_seqs = 0  # (no free running slot either: one would take the request at once)
    with pytest.raises(EngineOverloadedError):
        await eng.generate([1], SamplingParams(), request_id="busy").__anext__()


async def test_a_request_of_the_wrong_kind_is_refused_and_the_engine_lives_on(make_engine):
    """Found by QA: token ids as floats, a salt that is not text (or text UTF-8 cannot hold) passed
    generate() and crashed the step loop: every stream, this one's neighbours too, got
    EngineDeadError, and every later request."""
    eng = await make_engine()
    running = eng.generate([1, 2, 3], SamplingParams(max_tokens=8, temperature=0), request_id="alongside")
    first = await running.__anext__()
    for prompt, salt in (([1.0, 2.0], None), ([1, 2], 123), ([1, 2], "t\ud800"), ([1, True], None)):
        with pytest.raises(ValueError):
            await eng.generate(prompt, SamplingParams(max_tokens=2), request_id="bad", salt=salt).__anext__()
    outs = [first] + [o async for o in running]
    assert outs[-1].finished and not eng.is_dead
    import numpy as np  # NumPy integers are integers
    done = [o async for o in eng.generate(list(np.array([1, 2, 3])), SamplingParams(max_tokens=2),
                                          request_id="np", salt="tenant-1")]
    assert done[-1].finished


def hold_steps(eng) -> threading.Event:  # noqa: ANN001 - an AsyncEngine
    """Hold every engine step until the returned event is set (requests stay waiting meanwhile)."""
    gate = threading.Event()
    step = eng.engine.step

    def held_step():  # noqa: ANN202
        gate.wait(30)
        return step()

    eng.engine.step = held_step
    return gate


async def test_one_class_cannot_fill_the_waiting_queue(make_engine):
    """Found by QA: one tenant's batches filled the whole waiting queue and every other tenant got
    503. A class may have ``max_waiting_per_class`` requests waiting (sent and not yet taken by the
    step thread count too); other classes, and requests without one, still get in."""
    eng = await make_engine(max_waiting_per_class=3, max_num_seqs=1)  # (one runs, the others wait)
    gate = hold_steps(eng)
    params = SamplingParams(max_tokens=2, **GREEDY)
    tasks = [asyncio.ensure_future(collect(eng, [1, 2, 3], params, f"a{i}", priority_class="a")) for i in range(4)]
    await asyncio.sleep(0.2)  # registered; the first is in the engine, held in its step
    try:
        with pytest.raises(EngineClassFullError):
            await eng.generate([1, 2], params, request_id="a4", priority_class="a").__anext__()
        assert isinstance(EngineClassFullError("x"), EngineOverloadedError)  # callers that know only that
        tasks.append(asyncio.ensure_future(collect(eng, [1, 2, 3], params, "b0", priority_class="b")))
        tasks += [asyncio.ensure_future(collect(eng, [1, 2, 3], params, f"n{i}")) for i in range(4)]
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in tasks)  # all accepted, none refused
    finally:
        gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    assert all(len(tokens) == 2 for tokens, _text, _outs in results)
    # the queue drained: the class is free again
    tokens, _text, _outs = await asyncio.wait_for(collect(eng, [1, 2], params, "a5", priority_class="a"), 60)
    assert len(tokens) == 2


async def test_a_request_that_leaves_before_the_step_takes_it_frees_its_place_at_once(make_engine):
    """Found by QA: a refused batch's prompts, already sent and then withdrawn, kept their places in
    the queue until the step thread took the commands (the next step), and another tenant's request
    that fitted got a 503 meanwhile."""
    eng = await make_engine(max_waiting=3, max_num_seqs=1, max_waiting_per_class=64)
    gate = hold_steps(eng)
    params = SamplingParams(max_tokens=2, **GREEDY)
    first = asyncio.ensure_future(collect(eng, [1, 2, 3], params, "r0"))
    await asyncio.sleep(0.3)  # in the engine, its step held: what comes next stays in the command list
    try:
        sent = []
        for i in range(10):  # fill the queue
            task = asyncio.ensure_future(collect(eng, [1, 2, 3], params, f"b{i}", priority_class="b"))
            await asyncio.sleep(0.05)
            if task.done():
                assert isinstance(task.exception(), EngineOverloadedError)
                break
            sent.append(task)
        assert sent and len(sent) < 10
        for task in sent:  # their consumers leave (a batch refused after its first prompts were sent)
            task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
        later = [asyncio.ensure_future(collect(eng, [1, 2, 3], params, f"c{i}", priority_class="c"))
                 for i in range(len(sent))]
        await asyncio.sleep(0.2)
        refused = [t.exception() for t in later if t.done()]
        assert not refused, refused  # the places are free again, before any step
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), timeout=60)


async def test_a_burst_into_free_running_slots_is_not_waiting(make_engine):
    """Found by QA: with the share at 10, a burst of 15 from one tenant into an idle engine with 64
    free running slots got 5 refusals: the requests the next step admits at once do not wait."""
    eng = await make_engine(max_waiting_per_class=2, max_num_seqs=8)
    params = SamplingParams(max_tokens=2, **GREEDY)
    gate = hold_steps(eng)
    tasks = [asyncio.ensure_future(collect(eng, [1, 2, 3], params, f"a{i}", priority_class="a")) for i in range(10)]
    await asyncio.sleep(0.3)
    try:
        done = [t for t in tasks if t.done()]  # (a refused one is done with its error)
        assert not done, [t.exception() for t in done]  # 8 run at once, 2 wait: the share
        with pytest.raises(EngineClassFullError):
            await eng.generate([1, 2], params, request_id="a10", priority_class="a").__anext__()
    finally:
        gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    assert all(len(tokens) == 2 for tokens, _text, _outs in results)


async def test_free_slots_do_not_open_the_queue_while_requests_wait_for_kv_blocks(make_engine):
    """Found by QA: with the pool full of long prompts, free running slots let requests past
    ``max_waiting`` (10 waited against 4) and past a tenant's share: they waited for KV blocks like
    the others. Free slots count only while the last step left nothing waiting."""
    eng = await make_engine(num_blocks=8, max_num_seqs=8, max_waiting=2, max_num_batched_tokens=128)
    step = eng.engine.step

    def slow_step():  # noqa: ANN202 - the first request runs for a second or so
        time.sleep(0.02)
        return step()

    eng.engine.step = slow_step
    params = SamplingParams(max_tokens=50, **GREEDY)
    def prompt(i: int) -> list[int]:  # 70 tokens: 5 of the 8 blocks, growing to 8; none shared
        return [(i * 61 + t * 7) % 250 + 5 for t in range(70)]

    first = eng.generate(prompt(0), params, request_id="big0")
    await first.__anext__()  # admitted and running
    waiting = [asyncio.ensure_future(collect(eng, prompt(i), params, f"big{i}")) for i in (1, 2)]
    deadline = time.monotonic() + 10
    while eng.stats().waiting < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert (eng.stats().running, eng.stats().waiting) == (1, 2)  # 7 slots free, no blocks for them
    with pytest.raises(EngineOverloadedError):  # before: taken, as one of the 7 free slots
        await eng.generate(prompt(3), params, request_id="big3").__anext__()
    async for _ in first:
        pass
    results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
    assert all(len(tokens) == 50 for tokens, _text, _outs in results)
    # idle again: a burst into the free slots is taken whole, as before
    burst = await asyncio.wait_for(asyncio.gather(*(collect(eng, [1, 2, 3], SamplingParams(max_tokens=2, **GREEDY),
                                                            f"s{i}") for i in range(6))), timeout=60)
    assert all(len(tokens) == 2 for tokens, _text, _outs in burst)


async def test_free_slots_take_only_what_the_free_kv_blocks_hold(make_engine):
    """Found by a re-check: an idle engine took 8 long prompts into its 8 free running slots though
    its pool held one of them, and the rest, waiting for blocks, filled the queue: another tenant
    got 503s for seconds. A request counts as taken at once only with a slot and blocks for it."""
    # (a long burst window: the step thread takes nothing while the four arrive, as in a burst)
    eng = await make_engine(num_blocks=8, max_num_seqs=8, max_waiting=2, max_num_batched_tokens=128,
                            admission_gap_ms=400, admission_max_wait_ms=3000)
    params = SamplingParams(max_tokens=4, **GREEDY)

    def prompt(i: int) -> list[int]:  # 70 tokens: 5 of the 8 blocks; none shared
        return [(i * 61 + t * 7) % 250 + 5 for t in range(70)]

    tasks = [asyncio.ensure_future(collect(eng, prompt(i), params, f"long{i}")) for i in range(3)]
    await asyncio.sleep(0.05)
    done = [t for t in tasks if t.done()]
    assert not done, [t.exception() for t in done]  # one fits the pool at once, two wait: the queue
    with pytest.raises(EngineOverloadedError):  # before: taken, as one of the 8 free slots
        await eng.generate(prompt(3), params, request_id="long3").__anext__()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    assert all(len(tokens) == 4 for tokens, _text, _outs in results)
    deadline = time.monotonic() + 10  # (the figures follow the last outputs)
    while eng.stats().kv_blocks_used and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert eng.stats().kv_blocks_used == 0


async def test_requests_taken_into_the_step_in_progress_do_not_count_as_waiting(make_engine):
    """Found by a re-check: 3 requests into an idle engine, then 3 more of the same class while the
    first step was computing the first 3: the scheduler counted those as waiting until the step
    admitted them, and the second 3 got 429s with 5 slots and the pool free."""
    eng = await make_engine(max_num_seqs=8, max_waiting=4, max_waiting_per_class=2)
    params = SamplingParams(max_tokens=2, **GREEDY)
    gate = hold_steps(eng)
    first = [asyncio.ensure_future(collect(eng, [1, 2, i + 3], params, f"a{i}", priority_class="a"))
             for i in range(3)]
    deadline = time.monotonic() + 10
    while sum(eng._waiting_by_class.values()) < 3 and time.monotonic() < deadline:  # taken, step held
        await asyncio.sleep(0.005)
    try:
        second = [asyncio.ensure_future(collect(eng, [4, 5, i + 6], params, f"b{i}", priority_class="a"))
                  for i in range(3)]
        await asyncio.sleep(0.2)
        done = [t for t in second if t.done()]
        assert not done, [t.exception() for t in done]  # before: EngineClassFullError
    finally:
        gate.set()
    results = await asyncio.wait_for(asyncio.gather(*first, *second), timeout=60)
    assert all(len(tokens) == 2 for tokens, _text, _outs in results)


async def test_crashed_step_loop_fails_every_stream(make_engine):
    eng = await make_engine()

    def boom(*a, **kw):
        raise RuntimeError("kaboom")

    eng.engine.runner.run = boom
    results = await asyncio.wait_for(asyncio.gather(
        *(collect(eng, [1, 2, 3], SamplingParams(max_tokens=5), f"d{i}") for i in range(3)),
        return_exceptions=True), timeout=30)
    assert all(isinstance(r, EngineDeadError) for r in results)
    with pytest.raises(EngineDeadError):
        await eng.generate([1], SamplingParams(), request_id="after").__anext__()


async def test_a_request_after_shutdown_fails_at_once(make_engine):
    """Found by QA: generate() after shutdown() went to a step thread that had exited, and waited for
    ever; it gets EngineDeadError, as a request in flight at the shutdown does."""
    eng = await make_engine()
    await eng.shutdown()
    with pytest.raises(EngineDeadError, match="shut down"):
        await asyncio.wait_for(eng.generate([1, 2], SamplingParams(max_tokens=2), request_id="late").__anext__(), 5)


async def test_chat_and_text_prompts(make_engine):
    eng = await make_engine()
    plain = eng.encode_chat([{"role": "user", "content": "hi there"}])
    parts = eng.encode_chat([{"role": "user", "content": [{"type": "text", "text": "hi "},
                                                          {"type": "text", "text": "there"}]}])
    assert plain == parts
    assert eng.encode("ab") == [ord("a"), ord("b")]
    tokens, _, outs = await collect(eng, "hello", SamplingParams(max_tokens=3, **GREEDY), "t")
    assert len(tokens) == 3 and outs[-1].prompt_tokens == 5
    assert eng.model_id == "tiny" and eng.max_model_len > 0


def _first_step_size(eng):
    """Record how many requests the engine's first step after this call holds."""
    sizes = []
    step = eng.engine.step

    def recording_step():
        outs = step()
        if not sizes:
            sizes.append(len(eng.engine.requests) + sum(o.finished for o in outs))
        return outs

    eng.engine.step = recording_step
    return sizes


@pytest.mark.parametrize("gap_ms, together", [(0.0, False), (60.0, True)])
async def test_a_burst_from_idle_starts_as_one_step(make_engine, gap_ms, together):
    """Requests arriving 10 ms apart from an idle engine: with an admission gap larger than
    their spacing they all join the first step; with the gap off the first starts alone."""
    eng = await make_engine(admission_gap_ms=gap_ms, admission_max_wait_ms=500.0)
    first_step_sizes = _first_step_size(eng)
    params = SamplingParams(max_tokens=2, **GREEDY)

    async def one(i):
        await asyncio.sleep(0.01 * i)
        return await collect(eng, [5, 6, 7, i + 1], params, f"burst-{i}")

    await asyncio.gather(*(one(i) for i in range(4)))
    assert (first_step_sizes[0] == 4) is together


async def test_a_step_s_outputs_reach_the_loop_in_one_wake_up(make_engine, monkeypatch):
    """One cross-thread call per step for all its outputs, not one per request."""
    import engine.async_engine as ae

    calls: list[int] = []
    put_all = ae._put_all
    monkeypatch.setattr(ae, "_put_all", lambda items: (calls.append(len(items)), put_all(items))[1])
    eng = await make_engine()
    params = SamplingParams(max_tokens=6, **GREEDY)
    results = await asyncio.gather(*(collect(eng, list(range(3, 11)), params, f"w{i}") for i in range(8)))
    outputs = sum(len(r[2]) for r in results)
    assert sum(calls) == outputs and all(len(r[0]) == 6 for r in results)
    # (the live step count: the stats snapshot is taken after a step's outputs are handed over)
    assert len(calls) <= eng.engine.num_steps and max(calls) > 1  # several requests' outputs per call


async def test_announced_requests_spread_wider_than_the_gap_start_as_one_step(make_engine):
    """Four requests announced together, handed over 30 ms apart (30x the gap): the idle engine
    waits for the announced ones and starts them in one step; unannounced, the first starts alone."""
    for announced in (True, False):
        eng = await make_engine(admission_gap_ms=1.0, admission_max_wait_ms=2000.0)
        sizes = _first_step_size(eng)
        notices = [eng.announce() if announced else None for _ in range(4)]
        params = SamplingParams(max_tokens=2, **GREEDY)

        async def one(i, notices=notices, eng=eng, params=params):
            await asyncio.sleep(0.03 * i)  # the admission of each takes longer
            return await collect(eng, [5, 6, 7, i + 1], params, f"announced-{i}", notice=notices[i])

        results = await asyncio.gather(*(one(i) for i in range(4)))
        assert all(len(r[0]) == 2 for r in results)
        assert (sizes[0] == 4) is announced
        assert eng._burst.open_notices == 0


async def test_after_the_last_announced_request_the_engine_waits_only_the_notice_gap(make_engine, monkeypatch):
    """The waits the step thread sleeps while gathering: the short notice gap once everything
    announced is in, the full gap for unannounced arrivals."""
    import engine.arrivals as arrivals

    slept: list[float] = []
    real_sleep = arrivals.time.sleep

    class Clock:
        monotonic = staticmethod(arrivals.time.monotonic)

        @staticmethod
        def sleep(s):
            slept.append(s)
            real_sleep(s)

    monkeypatch.setattr(arrivals, "time", Clock)
    eng = await make_engine(admission_gap_ms=50.0, admission_notice_gap_ms=2.0, admission_max_wait_ms=5000.0)
    params = SamplingParams(max_tokens=1, **GREEDY)
    notices = [eng.announce() for _ in range(3)]
    await asyncio.gather(*(collect(eng, [5, 6, i + 1], params, f"n{i}", notice=n) for i, n in enumerate(notices)))
    # (what is left of the gap once the burst's requests are applied: they overlap it)
    assert all(0 < s <= 0.002 for s in slept)
    slept.clear()
    await collect(eng, [5, 6, 9], params, "plain")
    assert slept and slept[0] == pytest.approx(0.05)


async def test_a_withdrawn_or_dropped_notice_does_not_hold_the_burst(make_engine):
    """A request refused before the engine (its notice closed) or a notice dropped unclosed must
    not keep the engine waiting for max_wait (here 60 s)."""
    eng = await make_engine(admission_gap_ms=1.0, admission_max_wait_ms=60_000.0)
    params = SamplingParams(max_tokens=1, **GREEDY)
    refused, dropped, sent = eng.announce(), eng.announce(), eng.announce()
    assert eng._burst.open_notices == 3

    async def later():
        await asyncio.sleep(0.05)
        refused.close()
        refused.close()  # idempotent

    task = asyncio.ensure_future(later())
    del dropped  # garbage: closes itself
    tokens, _, _ = await asyncio.wait_for(collect(eng, [5, 6, 7], params, "sent", notice=sent), timeout=20)
    await task
    assert len(tokens) == 1 and eng._burst.open_notices == 0


async def test_a_request_the_engine_refuses_closes_its_notice(make_engine):
    eng = await make_engine(admission_gap_ms=1.0, admission_max_wait_ms=60_000.0)
    notice = eng.announce()
    with pytest.raises(PromptTooLongError):
        await collect(eng, list(range(3, 3 + eng.max_model_len)), SamplingParams(max_tokens=1, **GREEDY), "long",
                      notice=notice)
    assert not notice.open and eng._burst.open_notices == 0
    with eng.announce() as spare:  # the context manager form
        assert eng._burst.open_notices == 1
    assert not spare.open and eng._burst.open_notices == 0


async def test_sequences_waiting_to_be_recomputed_do_not_fill_the_queue(make_engine):
    """Found by a re-check: the children of one tenant's ``n=6`` request yielded to another tenant
    (fair running slots) counted as waiting requests, and a third tenant got 503 with no request
    queued. Only requests never admitted fill ``max_waiting``."""
    eng = await make_engine(max_num_seqs=2, max_waiting=3, num_blocks=128)
    long = SamplingParams(max_tokens=400, **GREEDY)
    a = eng.generate([1, 2, 3], SamplingParams(n=6, max_tokens=400, **GREEDY), request_id="a",
                     priority_class="a")
    await a.__anext__()  # forked: 6 sequences run in the 2 slots
    b = eng.generate([4, 5], long, request_id="b", priority_class="b")
    await b.__anext__()  # admitted: a's children yielded their slots
    deadline = time.monotonic() + 10
    while eng.stats().waiting < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert eng.engine.scheduler.num_yields >= 4 and eng.stats().waiting >= 4  # past max_waiting
    tokens, _text, _outs = await asyncio.wait_for(
        collect(eng, [6, 7], SamplingParams(max_tokens=2, **GREEDY), "c", priority_class="c"), 60)
    assert len(tokens) == 2
    for gen, rid in ((a, "a"), (b, "b")):
        await eng.abort(rid)
        async for _ in gen:
            pass


async def test_json_modes_vocabulary_is_built_at_start_not_by_the_first_request(make_engine):
    """The first JSON-mode request would otherwise hold every request's step while the vocabulary's
    trie is built (0.4-0.6 s for SmolLM2; found by QA)."""
    eng = await make_engine()
    vocab = eng.engine.json.vocab
    assert vocab is not None
    tokens, text, _ = await collect(eng, [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0, json_object=True),
                                    "j")
    assert eng.engine.json.vocab is vocab and text.lstrip().startswith("{")
