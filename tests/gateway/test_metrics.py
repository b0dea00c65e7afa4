"""``GET /metrics`` in Prometheus's text format: the request counters and histograms
(``gateway.metrics``), the engine's figures, and the workers' counters summed through files."""

from __future__ import annotations

import time

import httpx

from gateway.metrics import RequestMetrics, render, route_of, wants_prometheus


def _observe(m: RequestMetrics, **kw) -> None:  # noqa: ANN003
    args = dict(endpoint="chat.completions", model="m", tenant=7, status="ok", cache="miss", prompt_tokens=10,
                cached_prompt_tokens=4, completion_tokens=3, cost_usd=0.5, saved_usd=0.0, latency_s=0.2, ttft_s=0.05)
    m.observe(**{**args, **kw})


def _series(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_counters_and_histograms_in_the_text_format() -> None:
    m = RequestMetrics()
    _observe(m)
    _observe(m, latency_s=3.0, ttft_s=None, status="error", completion_tokens=0, cost_usd=0.25)
    _observe(m, model='we"ird\\name', cache=None)
    text = render(uptime_s=12.5, engine={"running": 2, "kv_usage": 0.25, "preemptions": 3}, engine_up=True,
                  model="m", processes=[(None, {"cache": {"hits": 4}})], requests=m)
    got = _series(text)
    assert got['pagegate_requests_total{endpoint="chat.completions",model="m",status="ok",cache="miss"}'] == 1
    assert got['pagegate_requests_total{endpoint="chat.completions",model="m",status="error",cache="miss"}'] == 1
    assert got['pagegate_requests_total{endpoint="chat.completions",model="we\\"ird\\\\name",status="ok",cache="none"}'] == 1
    assert got['pagegate_prompt_tokens_total{model="m",tenant="7"}'] == 20
    assert got['pagegate_cached_prompt_tokens_total{model="m",tenant="7"}'] == 8
    assert got['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 3
    assert got['pagegate_cost_usd_total{model="m",tenant="7"}'] == 0.75
    # cumulative buckets: 0.2 s twice (le 0.25 and up), 3 s once (le 5 and up)
    lat = 'pagegate_request_latency_seconds_bucket{endpoint="chat.completions",le="%s"}'
    assert got[lat % "0.1"] == 0 and got[lat % "0.25"] == 2 and got[lat % "2.5"] == 2 and got[lat % "5"] == 3
    assert got[lat % "+Inf"] == 3
    assert got['pagegate_request_latency_seconds_count{endpoint="chat.completions"}'] == 3
    assert abs(got['pagegate_request_latency_seconds_sum{endpoint="chat.completions"}'] - 3.4) < 1e-9
    assert got['pagegate_time_to_first_token_seconds_count{endpoint="chat.completions"}'] == 2
    assert got['pagegate_up{model="m"}'] == 1 and got["pagegate_engine_running_sequences"] == 2
    assert got["pagegate_engine_preemptions_total"] == 3 and got["pagegate_uptime_seconds"] == 12.5
    assert "# TYPE pagegate_request_latency_seconds histogram" in text
    assert "# TYPE pagegate_engine_preemptions_total counter" in text
    assert got['pagegate_cache_events_total{event="hits"}'] == 4


def _scrape(m: RequestMetrics) -> dict[str, float]:
    requests, processes = m.scrape(m.state())
    return _series(render(uptime_s=1, engine=None, engine_up=False, model=None, processes=processes,
                          requests=requests))


def test_a_process_without_an_engine_has_no_up_series() -> None:
    """Found by QA: a healthy gateway started with PAGEGATE_LOAD_ENGINE=false served
    ``pagegate_up{model=""} 0``, which an alert on ``pagegate_up == 0`` fires on."""
    m = RequestMetrics(None, None)
    requests, processes = m.scrape(m.state())
    text = render(uptime_s=1, engine=None, engine_up=False, model=None, processes=processes, requests=requests)
    assert "pagegate_up{" not in text and "# TYPE pagegate_up " not in text and "pagegate_uptime_seconds 1" in text
    dead = render(uptime_s=1, engine=None, engine_up=False, model="m", processes=processes, requests=requests)
    assert 'pagegate_up{model="m"} 0' in dead  # an engine that stopped still reads 0


def test_workers_sum_through_their_files_and_no_sum_goes_down(tmp_path) -> None:
    one, two = RequestMetrics(tmp_path, "1"), RequestMetrics(tmp_path, "2")
    one.process = lambda: {"loop": {"lag_ms_max_last_minute": 3.0, "stalls_total": 1}, "cache": {"hits": 2},
                           "embedder": {"busy": [["embeddings", "7", 1.5], ["lookups", "", 0.25]], "waiting": 3}}
    two.process = lambda: {"loop": {"lag_ms_max_last_minute": 5.0, "stalls_total": 4}, "cache": {"hits": 7}}
    _observe(one)
    _observe(two, completion_tokens=5)
    one.dump()
    two.dump()
    for m in (one, two):
        got = _scrape(m)
        assert got['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 8
        assert got['pagegate_request_latency_seconds_count{endpoint="chat.completions"}'] == 2
        # each process's own figures, labelled by worker
        assert got['pagegate_event_loop_stalls_total{worker="1"}'] == 1
        assert got['pagegate_cache_events_total{worker="2",event="hits"}'] == 7
        assert got['pagegate_embedder_busy_seconds_total{worker="1",work="embeddings",tenant="7"}'] == 1.5
        assert got['pagegate_embedder_busy_seconds_total{worker="1",work="lookups"}'] == 0.25
        assert got['pagegate_embedder_jobs_waiting{worker="1"}'] == 3
        assert not any(k.startswith("pagegate_embedder") and 'worker="2"' in k for k in got)  # no embedder yet
    # found by QA: live counts plus the other's (older) file went back and forth between the
    # workers' answers; a scrape now shows only what is in the files, written first
    _observe(one)  # counted by worker 1, not yet in its file
    first = _scrape(one)['pagegate_completion_tokens_total{model="m",tenant="7"}']
    assert first == 11
    assert _scrape(two)['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 11  # not back to 8
    again = RequestMetrics(tmp_path, "1")  # worker 1 started again: it goes on from its file
    _observe(again)
    assert _scrape(again)['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 14
    (tmp_path / "w3.json").write_text("{not json")  # half written or broken: left out, not an error
    assert _scrape(again)['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 14


def test_an_older_state_never_overwrites_a_newer_one(tmp_path) -> None:
    """The periodic write and a scrape's run on threads at once: a state taken earlier but written
    later would take the file, and every worker's sums, back."""
    m = RequestMetrics(tmp_path, "1")
    _observe(m)
    older = m.state()
    _observe(m, completion_tokens=5)
    m.dump(m.state())
    m.dump(older)
    assert _scrape(RequestMetrics(tmp_path, "2"))['pagegate_completion_tokens_total{model="m",tenant="7"}'] == 8


def test_what_asks_for_the_text_format() -> None:
    scraper = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    assert wants_prometheus(scraper, None) and wants_prometheus("text/plain", None)
    assert wants_prometheus(None, "prometheus") and not wants_prometheus("text/plain", "json")
    assert not wants_prometheus("*/*", None) and not wants_prometheus(None, None)
    assert not wants_prometheus("text/html,application/xhtml+xml,*/*;q=0.8", None)
    # found by QA: axios's default, and a text/plain refused by its q, got the text
    assert not wants_prometheus("application/json, text/plain, */*", None)
    assert not wants_prometheus("text/plain;q=0, application/json", None)
    assert wants_prometheus("application/json;q=0.5, text/plain", None)


def test_a_scrape_counts_the_requests_served(api) -> None:  # noqa: ANN001
    tenant_id, key = api.make_tenant()

    def scrape() -> dict[str, float]:
        resp = httpx.get(api.base_url + "/metrics", headers={"accept": "text/plain"}, timeout=30)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
        return _series(resp.text)

    before = scrape()
    url, h = api.base_url + "/v1/chat/completions", {"authorization": f"Bearer {key}"}
    usages = []
    for i in range(2):
        r = httpx.post(url, headers=h, timeout=120, json={
            "model": api.model, "max_tokens": 3, "messages": [{"role": "user", "content": f"Say {i} {time.time_ns()}"}]})
        assert r.status_code == 200
        usages.append(r.json()["usage"])
    after = scrape()
    series = f'{{model="{api.model}",tenant="{tenant_id}"}}'
    assert after["pagegate_prompt_tokens_total" + series] == sum(u["prompt_tokens"] for u in usages)
    assert after["pagegate_completion_tokens_total" + series] == sum(u["completion_tokens"] for u in usages)
    ok = f'pagegate_requests_total{{endpoint="chat.completions",model="{api.model}",status="ok",cache="bypass"}}'
    assert after[ok] - before.get(ok, 0) == 2
    count = 'pagegate_request_latency_seconds_count{endpoint="chat.completions"}'
    assert after[count] - before.get(count, 0) == 2
    assert after[f'pagegate_up{{model="{api.model}"}}'] == 1 and after["pagegate_engine_kv_blocks"] == 512
    assert "pagegate_event_loop_lag_max_seconds" in after
    # every response by route and status, refusals too (they have no usage row)
    bad = httpx.post(url, headers={"authorization": "Bearer pg-nope"}, timeout=30, json={})
    assert bad.status_code == 401
    httpx.get(api.base_url + "/v1/models/no-such-model", headers=h, timeout=30)
    httpx.get(api.base_url + "/no/such/path/" + "x" * 50, timeout=30)
    last = scrape()

    def responses(route: str, status: int, at: dict[str, float]) -> float:
        return at.get(f'pagegate_http_responses_total{{route="{route}",status="{status}"}}', 0)

    assert responses("/v1/chat/completions", 401, last) - responses("/v1/chat/completions", 401, before) == 1
    assert responses("/v1/chat/completions", 200, last) - responses("/v1/chat/completions", 200, before) == 2
    assert responses("/v1/models", 404, last) - responses("/v1/models", 404, before) == 1
    assert responses("other", 404, last) - responses("other", 404, before) == 1
    # without a scraper's Accept: the JSON answer, as before
    assert httpx.get(api.base_url + "/metrics", timeout=30).json()["engine"]["kv_blocks_total"] == 512


def test_routes_are_labelled_by_the_api_route_never_the_raw_path() -> None:
    assert route_of("/v1/chat/completions") == "/v1/chat/completions"
    assert route_of("/v1/models/org/some-model") == "/v1/models"
    assert route_of("/admin/v1/tenants/acme") == "/admin" and route_of("/admin/v1") == "/admin"
    # the dashboard's pages (found by QA: counted as /admin, /dashboard never came)
    assert route_of("/admin/login") == "/dashboard" and route_of("/admin/") == "/dashboard"
    assert route_of("/admin") == "/dashboard" and route_of("/admin/v1x") == "/dashboard"
    assert route_of("/administrator") == "other"
    assert route_of("/v1/chat/completionsX") == "other" and route_of("/" + "x" * 500) == "other"


async def test_a_metrics_token_guards_the_scrape(tmp_path, sqlite_url, redis_prefix) -> None:  # noqa: ANN001
    """Found by QA: any tenant (anyone reaching the port) read every tenant's tokens, spend and cache
    savings from /metrics, live. With ``PAGEGATE_METRICS_TOKEN`` set, a scrape needs it as a bearer
    token (JSON and text alike); a tenant's API key is not it."""
    from gateway.app import create_app
    from gateway.settings import Settings
    from tests.gateway.conftest import TENANCY_REDIS_URL

    token = "scrape-" + "x" * 24
    settings = Settings(database_url=sqlite_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                        data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        load_engine=False, cache_enabled=False, metrics_token=token)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        for headers in ({}, {"authorization": "Bearer pg-some-tenant-key"}, {"authorization": f"Basic {token}"},
                        {"authorization": f"Bearer {token}x"}):
            for params in ({}, {"format": "prometheus"}):
                resp = await client.get("/metrics", headers=headers, params=params)
                assert resp.status_code == 401, (headers, params, resp.text)
                assert resp.json()["error"]["code"] == "invalid_token"
                assert resp.headers["www-authenticate"] == "Bearer"
        ok = {"authorization": f"Bearer {token}"}
        assert (await client.get("/metrics", headers=ok)).json()["pid"] > 0
        text = (await client.get("/metrics", headers=ok, params={"format": "prometheus"})).text
        assert "pagegate_uptime_seconds" in text
        assert (await client.get("/health")).status_code == 200  # load balancers' check stays open


async def test_an_unknown_metrics_format_is_a_400(tmp_path, sqlite_url, redis_prefix) -> None:  # noqa: ANN001
    """Found by QA: ``/metrics?format=bogus`` (a typo of ``prometheus``) answered JSON without a word,
    so a scraper set up with it failed to parse and said nothing useful."""
    from gateway.app import create_app
    from gateway.settings import Settings
    from tests.gateway.conftest import TENANCY_REDIS_URL

    settings = Settings(database_url=sqlite_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                        data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        load_engine=False, cache_enabled=False)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        for bad in ("bogus", "promethues", ""):
            resp = await client.get("/metrics", params={"format": bad})
            assert resp.status_code == 400, (bad, resp.text)
            assert resp.json()["error"]["param"] == "format"
        assert (await client.get("/metrics", params={"format": "json"})).json()["pid"] > 0
        for good in ("prometheus", "OpenMetrics", "text"):
            resp = await client.get("/metrics", params={"format": good})
            assert resp.headers["content-type"].startswith("text/plain") and "pagegate_uptime_seconds" in resp.text


def test_a_short_metrics_token_is_refused() -> None:
    import pytest
    from pydantic import ValidationError

    from gateway.settings import Settings

    with pytest.raises(ValidationError):
        Settings(metrics_token="short", load_engine=False)


def test_sums_print_without_binary_noise() -> None:
    """Found by QA: a cost counter printed as 0.00011300000000000001."""
    m = RequestMetrics()
    for _ in range(3):
        _observe(m, cost_usd=0.1, saved_usd=0.0000113 / 3 * 10)
    text = render(uptime_s=1.5, engine=None, engine_up=True, model="m", processes=[], requests=m)
    series = _series(text)
    cost = [line for line in text.splitlines() if line.startswith("pagegate_cost_usd_total")]
    assert cost == ['pagegate_cost_usd_total{model="m",tenant="7"} 0.3'], cost
    assert series['pagegate_saved_usd_total{model="m",tenant="7"}'] == 0.000113


def test_a_long_sum_of_small_costs_prints_the_money_not_the_float_noise() -> None:
    """Found by a soak QA: ``0.000966220000000005`` for a sum whose rows add up to 0.00096622 (each
    row is billed to 1e-8 USD); ``.15g`` alone keeps the noise of many additions."""
    m = RequestMetrics()
    for cost in [0.00000002, 0.00000098, 0.00000034] * 800 + [0.00000022]:
        _observe(m, cost_usd=cost, saved_usd=0.0)
    text = render(uptime_s=1.5, engine=None, engine_up=True, model="m", processes=[], requests=m)
    cost = [line.split()[-1] for line in text.splitlines() if line.startswith("pagegate_cost_usd_total")]
    assert cost == ["0.00107222"], cost
