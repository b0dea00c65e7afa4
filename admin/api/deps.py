"""Dependencies of the admin API routes (``Annotated`` aliases): the context, the caller's
verified token with the scope a route needs, a database session, and an audited ``Management``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from admin.api.routing import SCOPE_KEY
from admin.auth import SCOPE_READ, SCOPE_WRITE, AdminPrincipal, bearer_token, require
from admin.context import AdminContext
from admin.management import Management


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
