"""Admin API authentication: HS256 tokens, RS256/ES256 against a JWKS file, and every refusal
as a 401/403 OpenAI-style error object."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from admin_testlib import SECRET, new_jwk, public_jwk, sign
from fastapi import FastAPI

import admin
from admin.auth import AdminTokenVerifier, mint_token
from admin.jwks import JwksError
from gateway.errors import ApiError

# Token checks never reach the database: run them once, on SQLite (test_admin_api covers every
# endpoint's refusals on both databases).
pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def jwt_claims(token: str) -> dict:
    import base64
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def _claims(settings, **over) -> dict:
    now = int(time.time())
    base = {"iss": settings.admin_jwt_issuer, "aud": settings.admin_jwt_audience, "sub": "idp-user", "iat": now,
            "exp": now + 300, "scope": "admin:read admin:write"}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def _assert_error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


async def test_hs256_token_grants_access(client, auth):
    resp = await client.get("/admin/v1/whoami", headers=auth("admin:read", sub="bob"))
    assert resp.status_code == 200
    assert resp.json()["sub"] == "bob"
    assert resp.json()["scopes"] == ["admin:read"]


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer"}, {"authorization": "Basic abc"},
                                     {"authorization": "Bearer not-a-jwt"}])
async def test_missing_or_malformed_token_is_401(client, headers):
    err = _assert_error(await client.get("/admin/v1/tenants", headers=headers), 401, "invalid_token")
    assert err["type"] == "invalid_request_error"


async def test_expired_token_is_401(client, settings):
    tok = mint_token(settings, ttl_s=-120)
    err = _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert "expired" in err["message"]


async def test_bad_signature_is_401(client, settings):
    other = settings.model_copy(update={"admin_jwt_secret": SECRET[::-1]})
    tok = mint_token(other)
    err = _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert "signature" in err["message"]
    # a flipped payload byte with the original signature also fails
    good = mint_token(settings)
    head, payload, sig = good.split(".")
    forged = ".".join([head, payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1], sig])
    _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {forged}"}),
                  401, "invalid_token")


async def test_wrong_issuer_and_alg_none_are_401(client, settings):
    tok = sign({"alg": "HS256"}, _claims(settings, iss="someone-else"), SECRET.encode())
    _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                  401, "invalid_token")
    import base64

    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    none_tok = f"{b64({'alg': 'none'})}.{b64(_claims(settings))}."
    _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {none_tok}"}),
                  401, "invalid_token")
    for header in ({"alg": ["HS256"]}, {"typ": "JWT"}, {"alg": "HS512"}, {"alg": "RS256", "kid": ["a"]}):
        odd = f"{b64(header)}.{b64(_claims(settings))}.c2ln"
        _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {odd}"}),
                      401, "invalid_token")


async def test_missing_sub_or_exp_is_401(client, settings):
    key = SECRET.encode()
    for missing in ("sub", "exp"):
        tok = sign({"alg": "HS256"}, _claims(settings, **{missing: None}), key)
        _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                      401, "invalid_token")


async def test_a_token_for_another_audience_is_401_and_one_without_exp_as_a_number_too(client, settings):
    """Found by QA: ``aud`` was never read (a token issued for another API was taken), and an
    ``exp`` of 1e400 or NaN never expired (and /whoami answered 500)."""
    key = SECRET.encode()

    async def status(claims: dict) -> httpx.Response:
        tok = sign({"alg": "HS256"}, claims, key)
        return await client.get("/admin/v1/whoami", headers={"authorization": f"Bearer {tok}"})

    for aud in ("other-app", ["x", "y"]):
        err = _assert_error(await status(_claims(settings, aud=aud)), 401, "invalid_token")
        assert "audience" in err["message"] and settings.admin_jwt_audience in err["message"]
    assert (await status(_claims(settings, aud=["x", settings.admin_jwt_audience]))).status_code == 200
    assert (await status(_claims(settings, aud=None))).status_code == 200  # the server's own secret: aud optional
    assert jwt_claims(mint_token(settings))["aud"] == settings.admin_jwt_audience
    for name in ("exp", "nbf", "iat"):
        for bad in (float("inf"), float("nan"), "1e400", 10**400):
            err = _assert_error(await status(_claims(settings, **{name: bad})), 401, "invalid_token")
            assert f"'{name}' must be a finite number" in err["message"]


async def test_signed_claims_that_are_no_json_object_are_malformed_not_a_bad_signature(client):
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    for payload in (b"[1, 2]", b"not json", b"[" * 5000 + b"]" * 5000):  # (nested deep: a re-check's 500)
        signing_input = f"{b64(json.dumps({'alg': 'HS256'}).encode())}.{b64(payload)}"
        sig = b64(hmac.new(SECRET.encode(), signing_input.encode(), hashlib.sha256).digest())
        err = _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {signing_input}.{sig}"}),
                            401, "invalid_token")
        assert "malformed" in err["message"] and "signature" not in err["message"]


async def test_read_scope_cannot_write_and_no_scope_cannot_read(client, auth, settings):
    err = _assert_error(await client.post("/admin/v1/tenants", json={"name": "nope"}, headers=auth("admin:read")),
                        403, "insufficient_scope")
    assert err["type"] == "permission_error"
    assert "admin:write" in err["message"]
    key = SECRET.encode()
    tok = sign({"alg": "HS256"}, _claims(settings, scope="openid profile"), key)
    _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                  403, "insufficient_scope")
    # admin:write alone implies admin:read
    assert (await client.get("/admin/v1/tenants", headers=auth("admin:write"))).status_code == 200


@pytest.fixture(scope="module")
def signing_keys():
    """An IdP's RSA and EC keys, made once (RSA key generation is the slow part of these tests)."""
    return new_jwk("RSA", "rsa-1"), new_jwk("EC", "ec-1")


@pytest.fixture
def jwks(tmp_path, signing_keys):
    rsa, ec = signing_keys
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [public_jwk(rsa), public_jwk(ec)]}))
    return path, rsa, ec


@pytest.fixture
async def idp_client(settings, jwks):
    path, _, _ = jwks
    app = FastAPI()
    router = admin.build_admin_router(settings.model_copy(update={"admin_jwks_url": str(path)}))
    app.include_router(router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin.test") as c:
        yield c
    await router.admin_context.aclose()


async def test_an_identity_providers_token_must_name_the_audience(idp_client, settings, jwks):
    _, rsa, _ = jwks
    for aud, code in ((None, 401), ("other-api", 401), (settings.admin_jwt_audience, 200)):
        tok = sign({"alg": "RS256", "kid": rsa.kid}, _claims(settings, aud=aud), rsa)
        resp = await idp_client.get("/admin/v1/whoami", headers={"authorization": f"Bearer {tok}"})
        assert resp.status_code == code, resp.text
        if aud is None:
            assert "aud" in resp.json()["error"]["message"]


async def test_rs256_and_es256_tokens_from_jwks_file(idp_client, settings, jwks):
    _, rsa, ec = jwks
    for alg, key in (("RS256", rsa), ("ES256", ec)):
        tok = sign({"alg": alg, "kid": key.kid}, _claims(settings, sub=f"idp-{alg}", scope=None,
                                                               scp=["admin:read"]), key)
        resp = await idp_client.get("/admin/v1/whoami", headers={"authorization": f"Bearer {tok}"})
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"sub": f"idp-{alg}", "scopes": ["admin:read"], "exp": resp.json()["exp"]}
        # read-only IdP token cannot write
        _assert_error(await idp_client.post("/admin/v1/tenants", json={"name": "x"},
                                            headers={"authorization": f"Bearer {tok}"}), 403, "insufficient_scope")
    # HS256 tokens keep working next to the JWKS
    hs = mint_token(settings)
    assert (await idp_client.get("/admin/v1/whoami", headers={"authorization": f"Bearer {hs}"})).status_code == 200


async def test_unknown_kid_and_foreign_key_are_401(idp_client, settings, jwks):
    _, rsa, _ = jwks
    stranger = new_jwk("RSA", "rsa-9")
    tok = sign({"alg": "RS256", "kid": "rsa-9"}, _claims(settings), stranger)
    err = _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert "rsa-9" in err["message"]
    # a stranger's key that claims a known kid fails the signature check
    tok = sign({"alg": "RS256", "kid": rsa.kid}, _claims(settings), stranger)
    err = _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert "signature" in err["message"]
    # expired IdP token
    tok = sign({"alg": "RS256", "kid": rsa.kid}, _claims(settings, exp=int(time.time()) - 300), rsa)
    _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                  401, "invalid_token")


async def test_rs256_without_jwks_configured_is_401(client, settings):
    rsa = new_jwk("RSA", "rsa-1")
    tok = sign({"alg": "RS256", "kid": "rsa-1"}, _claims(settings), rsa)
    _assert_error(await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                  401, "invalid_token")


async def test_jwks_rotation_is_picked_up_on_unknown_kid(settings, tmp_path):
    first = new_jwk("RSA", "old")
    second = new_jwk("RSA", "new")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [public_jwk(first)]}))
    verifier = AdminTokenVerifier(settings.model_copy(update={"admin_jwks_url": f"file://{path}"}))
    verifier.jwks.refresh_floor_s = 0
    tok_old = sign({"alg": "RS256", "kid": "old"}, _claims(settings), first)
    assert (await verifier.verify(tok_old)).subject == "idp-user"
    path.write_text(json.dumps({"keys": [public_jwk(second)]}))
    tok_new = sign({"alg": "RS256", "kid": "new"}, _claims(settings), second)
    assert (await verifier.verify(tok_new)).subject == "idp-user"  # re-read on the unknown kid
    with pytest.raises(ApiError) as info:
        await verifier.verify(tok_old)  # cached set still fresh: old key is gone after re-read
    assert info.value.status == 401


async def test_jwks_over_http(settings, jwks):
    """The JWKS can be a URL (as an IdP publishes it); fetched with an async client."""
    import http.server
    import threading

    path, rsa, _ = jwks
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        hits = 0

        def do_GET(self):  # noqa: N802 - http.server API
            Handler.hits += 1
            self.send_response(200 if self.path == "/.well-known/jwks.json" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep test output quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
        verifier = AdminTokenVerifier(settings.model_copy(update={"admin_jwks_url": url}))
        tok = sign({"alg": "RS256", "kid": rsa.kid}, _claims(settings), rsa)
        for _ in range(3):
            assert (await verifier.verify(tok)).subject == "idp-user"
        assert Handler.hits == 1  # cached
        secret_url = url.replace("http://", "http://idpuser:hunter2@").replace("jwks", "nope")
        bad = AdminTokenVerifier(settings.model_copy(update={"admin_jwks_url": secret_url}))
        before = Handler.hits
        for _ in range(3):
            with pytest.raises(ApiError) as info:
                await bad.verify(tok)
            # the reply names no URL (found by a security QA: its credentials were in it)
            assert info.value.status == 401 and "key set" in info.value.message
            assert "hunter2" not in info.value.message and "127.0.0.1" not in info.value.message
        assert Handler.hits == before + 1  # never read yet: at most one read per refresh floor all the same
        with pytest.raises(JwksError) as why:
            await bad.jwks.get(rsa.kid)
        assert "hunter2" not in str(why.value) and "***@127.0.0.1" in str(why.value)  # the log's line
    finally:
        server.shutdown()
        server.server_close()


async def test_key_type_must_match_alg_and_sub_must_be_a_string(idp_client, settings, jwks):
    """An RS256 header naming the EC key's kid is refused before verifying (no 500 from a key of the
    wrong type); a token whose ``sub`` is not a string is refused (it is written to the audit log)."""
    _, rsa, ec = jwks
    tok = sign({"alg": "RS256", "kid": ec.kid}, _claims(settings), rsa)
    err = _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert ec.kid in err["message"] and "RSA" in err["message"]
    tok = sign({"alg": "HS256"}, _claims(settings, sub=12345), SECRET.encode())
    err = _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                        401, "invalid_token")
    assert "sub" in err["message"]
    tok = sign({"alg": "HS256"}, _claims(settings, exp="tomorrow"), SECRET.encode())
    _assert_error(await idp_client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {tok}"}),
                  401, "invalid_token")


async def test_jwks_skips_a_malformed_key_and_survives_an_unreachable_idp(settings, tmp_path):
    good = new_jwk("EC", "good")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{"kty": "RSA", "kid": "broken", "n": "AQAB"}, public_jwk(good)]}))
    verifier = AdminTokenVerifier(settings.model_copy(update={"admin_jwks_url": str(path)}))
    verifier.jwks.ttl_s = 0  # every verify wants a fresh read
    verifier.jwks.refresh_floor_s = 0
    tok = sign({"alg": "ES256", "kid": "good"}, _claims(settings), good)
    assert (await verifier.verify(tok)).subject == "idp-user"
    path.unlink()  # the IdP goes away: the last good set keeps working
    assert (await verifier.verify(tok)).subject == "idp-user"
    fresh = AdminTokenVerifier(settings.model_copy(update={"admin_jwks_url": str(path)}))
    with pytest.raises(ApiError) as info:  # never read: nothing to fall back on
        await fresh.verify(tok)
    assert info.value.status == 401 and "key set" in info.value.message



async def _answer_without_the_whole_body(app, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:  # noqa: ANN001
    """Sends the head and a first slice of a large body, then never the rest: the answer must come
    without it (a request reading its body would wait here until the timeout)."""
    import asyncio

    sent: list[dict] = []
    first = True

    async def receive() -> dict:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b'{"name": "' + b"a" * 1000, "more_body": True}
        await asyncio.Event().wait()  # the rest never comes
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("admin.test", 80),
             "client": ("127.0.0.1", 1234), "app": app,
             "headers": [(b"host", b"admin.test"), (b"content-type", b"application/json"),
                         (b"content-length", b"5000000"), *headers]}
    await asyncio.wait_for(app(scope, receive, send), 10)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": status, **json.loads(body)}


@pytest.mark.parametrize(("method", "path"), [("POST", "/admin/v1/tenants"), ("PATCH", "/admin/v1/tenants/x"),
                                              ("PUT", "/admin/v1/prices/some-model")])
async def test_a_body_is_not_read_before_the_token_is_checked(app, auth, method, path) -> None:  # noqa: ANN001
    """Found by QA: FastAPI parses the body before any dependency runs, so 8 MB bodies sent
    without a token were parsed on the event loop (about a second each) before their 401."""
    answer = await _answer_without_the_whole_body(app, method, path, [])
    assert answer["status"] == 401 and answer["error"]["code"] == "invalid_token", answer
    reader = [(b"authorization", auth("admin:read")["authorization"].encode())]
    answer = await _answer_without_the_whole_body(app, method, path, reader)
    assert answer["status"] == 403 and answer["error"]["code"] == "insufficient_scope", answer


async def test_the_placeholder_secret_signs_nothing_outside_dev_mode(db_url) -> None:  # noqa: ANN001, ARG001
    """Found by QA: the built-in placeholder secret is in the source, so anyone could sign an
    admin:write token for a server that kept it. Outside dev mode (`make run`) HS256 tokens are then
    refused; in dev mode, and with a secret of one's own, they are taken."""
    from gateway.settings import Settings

    production = Settings(load_engine=False, dev_mode=False)
    assert production.admin_jwt_secret == Settings.model_fields["admin_jwt_secret"].default
    forged = mint_token(production, subject="mallory", scopes=("admin:read", "admin:write"), ttl_s=600)
    with pytest.raises(ApiError) as refused:
        await AdminTokenVerifier(production).verify(forged)
    assert refused.value.status == 401 and "placeholder" in refused.value.message
    dev = Settings(load_engine=False, dev_mode=True)
    assert (await AdminTokenVerifier(dev).verify(forged)).subject == "mallory"
    # a token signed with another secret: the dev server says which one it runs on (a QA find: the
    # README's example exported its own secret against `make run`'s server, and the 401 said no more)
    other = mint_token(Settings(load_engine=False, admin_jwt_secret="y" * 40), subject="alice", ttl_s=600)
    with pytest.raises(ApiError) as refused:
        await AdminTokenVerifier(dev).verify(other)
    assert refused.value.status == 401 and "dev mode on the built-in secret" in refused.value.message
    with pytest.raises(ApiError) as refused:  # and only a dev server on the placeholder says so
        await AdminTokenVerifier(Settings(load_engine=False, admin_jwt_secret="x" * 40)).verify(other)
    assert refused.value.message == "The admin token's signature is invalid."
    own = Settings(load_engine=False, admin_jwt_secret="x" * 40)
    token = mint_token(own, subject="alice", scopes=("admin:read",), ttl_s=600)
    assert (await AdminTokenVerifier(own).verify(token)).subject == "alice"


async def test_an_empty_secret_says_so(db_url) -> None:  # noqa: ANN001, ARG001
    """Found by QA: with PAGEGATE_ADMIN_JWT_SECRET empty every token was 'signature is invalid' and
    `pagegate admin token` failed in Authlib's words."""
    from gateway.settings import Settings

    empty = Settings(load_engine=False, admin_jwt_secret="")
    with pytest.raises(ValueError, match="PAGEGATE_ADMIN_JWT_SECRET is empty"):
        mint_token(empty, subject="alice")
    token = sign({"alg": "HS256"}, _claims(empty), b"some-other-secret-of-at-least-32-bytes")
    with pytest.raises(ApiError) as refused:
        await AdminTokenVerifier(empty).verify(token)
    assert refused.value.status == 401 and "PAGEGATE_ADMIN_JWT_SECRET is empty" in refused.value.message


@pytest.mark.parametrize("sub", ["nul\u0000byte", "line1\nFAKE audit line", " ", "", "x" * 257])
async def test_a_subject_that_cannot_be_an_audit_actor_is_401(client, settings, sub) -> None:  # noqa: ANN001
    """Found by QA: a NUL in a validly signed token's ``sub`` was a 500 on PostgreSQL (the audit
    row's insert), a line break forged a line of `pagegate admin audit`."""
    tok = sign({"alg": "HS256"}, _claims(settings, sub=sub), SECRET.encode())
    error = _assert_error(await client.post("/admin/v1/tenants", json={"name": "never-made"},
                                            headers={"authorization": f"Bearer {tok}"}), 401, "invalid_token")
    assert "'sub'" in error["message"]
    with pytest.raises(ValueError, match="subject"):
        mint_token(settings, subject=sub)
