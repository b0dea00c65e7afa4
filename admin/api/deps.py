"""Dependencies of the admin API routes (``Annotated`` aliases): the context, the caller's
verified token with the scope a route needs, a database session, an audited ``Management``, and
a list's page (``limit``, ``after``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from pydantic import BeforeValidator
from sqlalchemy.ext.asyncio import AsyncSession

from admin.api.routing import SCOPE_KEY, bad_request
from admin.auth import SCOPE_READ, SCOPE_WRITE, AdminPrincipal, bearer_token, require
from admin.context import AdminContext
from admin.management import MAX_PAGE_SIZE, PAGE_SIZE, Management
from admin.schemas import INT32_MAX, plain_whole_number


def _context(request: Request) -> AdminContext:
    return request.scope[SCOPE_KEY]


ContextDep = Annotated[AdminContext, Depends(_context)]


async def _principal(request: Request, ctx: ContextDep) -> AdminPrincipal:
    return await ctx.verifier.verify(bearer_token(request.headers.get("authorization", "")))


async def _reader(p: Annotated[AdminPrincipal, Depends(_principal)]) -> AdminPrincipal:
    return require(p, SCOPE_READ)


async def _writer(p: Annotated[AdminPrincipal, Depends(_principal)]) -> AdminPrincipal:
    return require(p, SCOPE_WRITE)


ReaderDep = Annotated[AdminPrincipal, Depends(_reader)]
WriterDep = Annotated[AdminPrincipal, Depends(_writer)]


async def _session(ctx: ContextDep) -> AsyncIterator[AsyncSession]:
    async with ctx.database.sessionmaker() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(_session)]


def _reading(who: ReaderDep, ctx: ContextDep, session: SessionDep) -> Management:
    return Management(session=session, actor=who.subject, redis=ctx.redis, redis_prefix=ctx.settings.redis_prefix)


def _writing(who: WriterDep, ctx: ContextDep, session: SessionDep) -> Management:
    return Management(session=session, actor=who.subject, redis=ctx.redis, redis_prefix=ctx.settings.redis_prefix)


ReadDep = Annotated[Management, Depends(_reading)]
WriteDep = Annotated[Management, Depends(_writing)]

_NOTHING = frozenset({b"", b"{}", b"null"})


async def _writing_bare(ops: WriteDep, request: Request) -> Management:
    """``WriteDep`` for a change that takes no body (revoke, rotate, disable, enable, delete): one is
    refused, after the token's scope (found by QA: ``DELETE /tenants/t {"force": true}`` and a rotate
    with ``{"x": 1}`` acted, so a script that thought it passed an option got a silent change).
    Nothing, whitespace, ``{}`` and ``null`` pass: what clients send for "no body"."""
    if (await request.body()).strip() not in _NOTHING:
        raise bad_request(f"{request.method} {request.url.path} takes no request body; send none.")
    return ops


WriteBareDep = Annotated[Management, Depends(_writing_bare)]


@dataclass(frozen=True, slots=True)
class PageQuery:
    """A list's ``limit`` and ``after`` cursor, checked: a bad value is a 400 naming the parameter."""

    limit: int
    after: int | None


# ASCII digits only: pydantic's lax int would read "5.0", " 5", "+5" or "1_000" as a number
QueryInt = BeforeValidator(plain_whole_number)


def _page(limit: Annotated[int, QueryInt, Query(ge=1, le=MAX_PAGE_SIZE,
                                                description=f"rows per page, 1..{MAX_PAGE_SIZE}")] = PAGE_SIZE,
          # bounded by the id columns' range: past it PostgreSQL would refuse the comparison (a 500)
          after: Annotated[int | None, QueryInt, Query(ge=1, le=INT32_MAX, description=(
              "the previous page's last_id: the page starts past it (higher ids; in the audit log, "
              "older entries)"))] = None) -> PageQuery:
    return PageQuery(limit=limit, after=after)


PageDep = Annotated[PageQuery, Depends(_page)]
