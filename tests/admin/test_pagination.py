"""Cursor pagination of the admin API's lists (tenants, keys, a tenant's keys, the audit log) against
real SQLite and PostgreSQL: pages cover every row once, in id order, while rows are added between
pages; ``has_more``/``first_id``/``last_id``; filters; bad ``limit``/``after`` are 400 with ``param``."""

from __future__ import annotations

import uuid

import pytest
from admin_testlib import unique
from sqlalchemy import select

from gateway.db.models import ApiKey, AuditLog, Tenant

INT32_MAX = 2**31 - 1


async def _get(client, auth, path: str, **params) -> dict:
    resp = await client.get(path, params=params, headers=auth("admin:read"))
    assert resp.status_code == 200, resp.text
    return resp.json()


def _check_page(page: dict, limit: int) -> None:
    """The OpenAI list shape, its ids the ends of ``data``."""
    assert set(page) == {"object", "data", "has_more", "first_id", "last_id"}
    assert page["object"] == "list" and len(page["data"]) <= limit
    ids = [row["id"] for row in page["data"]]
    assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
    if page["has_more"]:
        assert len(ids) == limit


async def _all_pages(client, auth, path: str, limit: int, after: int | None = None, **params) -> list[dict]:
    """Every page of a list (past ``after``), following ``last_id`` until ``has_more`` is false."""
    pages = []
    while True:
        page = await _get(client, auth, path, limit=limit, **params, **({"after": after} if after else {}))
        _check_page(page, limit)
        pages.append(page)
        if not page["has_more"]:
            return pages
        after = page["last_id"]


async def _create_tenant(client, auth, name: str) -> int:
    resp = await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


async def _create_key(client, auth, tenant: str, name: str) -> int:
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": name}, headers=auth())
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


async def test_tenant_pages_cover_every_tenant_once_in_id_order(client, app, auth):
    tag = uuid.uuid4().hex[:8]
    # created in reverse name order: a list ordered by name would not be in id order
    mine = [await _create_tenant(client, auth, f"pgn-{tag}-{c}") for c in "dcb"]
    first = await _get(client, auth, "/admin/v1/tenants", limit=2)
    _check_page(first, 2)
    assert first["has_more"] is True
    # added after the first page was read, named to sort first: it must still come, once, at the end
    late = await _create_tenant(client, auth, f"pgn-{tag}-a")
    rest = await _all_pages(client, auth, "/admin/v1/tenants", 2, after=first["last_id"])
    ids = [t["id"] for page in [first, *rest] for t in page["data"]]
    assert ids == sorted(set(ids))  # ascending, no repeats
    async with app.state.admin_context.database.sessionmaker() as s:
        assert ids == list((await s.execute(select(Tenant.id).where(Tenant.deleted_at.is_(None)).order_by(Tenant.id))).scalars())
    assert [i for i in ids if i in (*mine, late)] == [*mine, late]
    assert ids[-1] == late and rest[-1]["has_more"] is False


async def test_key_pages_exact_ends_and_rows_added_between_pages(client, auth):
    tenant = unique("pgn-keys")
    await _create_tenant(client, auth, tenant)
    keys = [await _create_key(client, auth, tenant, n) for n in ("z", "y", "x", "w")]
    for path, params in ((f"/admin/v1/tenants/{tenant}/keys", {}), ("/admin/v1/keys", {"tenant": tenant})):
        one = await _get(client, auth, path, limit=2, **params)
        two = await _get(client, auth, path, limit=2, after=one["last_id"], **params)
        three = await _get(client, auth, path, limit=2, after=two["last_id"], **params)
        for page in (one, two, three):
            _check_page(page, 2)
        assert [[k["id"] for k in p["data"]] for p in (one, two, three)] == [keys[:2], keys[2:], []]
        # exactly two rows were left for the second page: it has no more, and the third is empty
        assert (one["has_more"], two["has_more"], three["has_more"]) == (True, False, False)
        assert (three["first_id"], three["last_id"]) == (None, None)
        assert {k["tenant"] for k in one["data"] + two["data"]} == {tenant}

    one = await _get(client, auth, f"/admin/v1/tenants/{tenant}/keys", limit=3)
    keys.append(await _create_key(client, auth, tenant, "v"))  # a key added between two pages
    two = await _get(client, auth, f"/admin/v1/tenants/{tenant}/keys", limit=3, after=one["last_id"])
    assert [k["id"] for k in one["data"] + two["data"]] == keys
    assert (one["has_more"], two["has_more"]) == (True, False)


async def test_key_filters_combine_with_pages(client, auth):
    tenant = unique("pgn-filter")
    await _create_tenant(client, auth, tenant)
    other = unique("pgn-other")
    await _create_tenant(client, auth, other)
    keys = []
    for i in range(5):
        keys.append(await _create_key(client, auth, tenant, f"k{i}"))
        await _create_key(client, auth, other, f"o{i}")  # interleaved ids of another tenant's keys
    for revoked in (keys[1], keys[3]):
        assert (await client.post(f"/admin/v1/keys/{revoked}/revoke", headers=auth())).status_code == 200
    pages = await _all_pages(client, auth, "/admin/v1/keys", 2, tenant=tenant, include_revoked="false")
    assert [[k["id"] for k in p["data"]] for p in pages] == [[keys[0], keys[2]], [keys[4]]]
    assert all(not k["revoked"] for p in pages for k in p["data"])
    pages = await _all_pages(client, auth, "/admin/v1/keys", 2, tenant=tenant)
    assert [k["id"] for p in pages for k in p["data"]] == keys and len(pages) == 3

    prefix = (await _get(client, auth, f"/admin/v1/keys/{keys[2]}"))["prefix"]
    page = await _get(client, auth, "/admin/v1/keys", prefix=prefix, limit=1)
    assert [k["id"] for k in page["data"]] == [keys[2]] and page["has_more"] is False
    page = await _get(client, auth, "/admin/v1/keys", prefix=prefix, after=keys[2])
    assert page["data"] == [] and page["has_more"] is False


async def test_audit_pages_go_to_older_entries_and_stay_put_when_new_ones_arrive(client, auth):
    tenant = unique("pgn-audit")
    target = f"tenant:{tenant}"
    await _create_tenant(client, auth, tenant)
    for rpm in (1, 2, 3):
        resp = await client.patch(f"/admin/v1/tenants/{tenant}", json={"rpm": rpm}, headers=auth())
        assert resp.status_code == 200, resp.text

    first = await _get(client, auth, "/admin/v1/audit", target=target, limit=2)
    _check_page(first, 2)
    assert [e["after"]["rpm"] for e in first["data"]] == [3, 2] and first["has_more"] is True
    # a newer entry between two pages must not push an entry already seen onto the next page
    assert (await client.patch(f"/admin/v1/tenants/{tenant}", json={"rpm": 4}, headers=auth())).status_code == 200
    second = await _get(client, auth, "/admin/v1/audit", target=target, limit=2, after=first["last_id"])
    _check_page(second, 2)
    assert [e["action"] for e in second["data"]] == ["tenant.update", "tenant.create"]
    assert second["data"][0]["after"]["rpm"] == 1 and second["has_more"] is False
    ids = [e["id"] for e in first["data"] + second["data"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 4

    updates = await _all_pages(client, auth, "/admin/v1/audit", 2, target=target, action="tenant.update")
    assert [[e["after"]["rpm"] for e in p["data"]] for p in updates] == [[4, 3], [2, 1]]
    assert [e["action"] for e in (await _get(client, auth, "/admin/v1/audit", target=target))["data"]] == [
        "tenant.update"] * 4 + ["tenant.create"]


async def test_default_and_largest_page(client, app, auth):
    """With no ``limit`` a page holds 100 rows; ``limit=1000`` is allowed."""
    tenant = unique("pgn-many")
    tenant_id = await _create_tenant(client, auth, tenant)
    target = f"test:{uuid.uuid4().hex}"
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all(ApiKey(tenant_id=tenant_id, key_hash=uuid.uuid4().hex * 2, prefix=f"pg-{i:05d}", revoked=False)
                  for i in range(101))
        s.add_all(AuditLog(actor="test", action="test.row", target=target) for _ in range(101))
        await s.commit()
    for path, params in ((f"/admin/v1/tenants/{tenant}/keys", {}), ("/admin/v1/keys", {"tenant": tenant}),
                         ("/admin/v1/audit", {"target": target})):
        page = await _get(client, auth, path, **params)
        assert len(page["data"]) == 100 and page["has_more"] is True, path
        rest = await _get(client, auth, path, after=page["last_id"], **params)
        assert len(rest["data"]) == 1 and rest["has_more"] is False, path
        whole = await _get(client, auth, path, limit=1000, **params)
        assert [r["id"] for r in whole["data"]] == [r["id"] for r in page["data"] + rest["data"]]
        assert whole["has_more"] is False


BAD_VALUES = [("limit", "0"), ("limit", "-1"), ("limit", "1001"), ("limit", "ten"), ("limit", "2.5"),
              ("limit", ""), ("after", "0"), ("after", "-3"), ("after", "x"), ("after", "1.5"),
              ("after", str(INT32_MAX + 1)), ("after", "99999999999999999999"),  # past the id columns
              # not plain digits: pydantic's lax int would read these as 5 or 1000
              ("limit", "5.0"), ("limit", " 5"), ("limit", "5 "), ("limit", "+5"), ("limit", "1_000"),
              ("limit", "٣"), ("after", "2.0"), ("after", "+2"), ("after", "1_0"), ("after", "")]


@pytest.mark.parametrize("path", ["/admin/v1/tenants", "/admin/v1/keys", "/admin/v1/tenants/nobody/keys",
                                  "/admin/v1/audit"])
async def test_bad_limit_or_after_is_400_naming_it(client, auth, path):
    for param, value in BAD_VALUES:
        resp = await client.get(path, params={param: value}, headers=auth("admin:read"))
        assert resp.status_code == 400, (param, value, resp.text)
        error = resp.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), (value, error)
        assert error["message"].startswith(f"{param}: "), error
    resp = await client.get(path, params={"limit": "0"})  # the token is checked first
    assert resp.status_code == 401


async def test_a_limit_with_a_point_is_named_as_not_a_whole_number(client, auth):
    resp = await client.get("/admin/v1/tenants", params={"limit": "5.0"}, headers=auth("admin:read"))
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "limit: must be a whole number in plain digits (0-9)"


@pytest.mark.parametrize("path", ["/admin/v1/tenants", "/admin/v1/keys", "/admin/v1/audit"])
async def test_largest_cursor_is_accepted(client, app, auth, path):
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all(AuditLog(actor="test", action="test.row", target="test:largest-cursor") for _ in range(2))
        await s.commit()
    page = await _get(client, auth, path, after=INT32_MAX, limit=1)
    _check_page(page, 1)
    if path == "/admin/v1/audit":  # newest first: every entry is older than the largest id
        assert len(page["data"]) == 1 and page["has_more"] is True
    else:
        assert page == {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
