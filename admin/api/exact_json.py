"""JSON in and out of the admin API with money kept exact. FastAPI reads a body's numbers as
floats and writes a ``Decimal`` through a float (or, in pydantic's JSON mode, as a string, which
would change the field's type for clients); either way ``1234567890.12345678`` loses digits. Here
a body's fractional numbers are read as Decimals and a reply's Decimals are written as the JSON
numbers they are."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse


def dumps(value: Any) -> str:
    """Compact JSON of dicts, lists, strings, numbers, booleans, None and finite Decimals."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} has no JSON number")
        return format(value, "f")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class ExactJSONResponse(JSONResponse):
    """``JSONResponse`` whose Decimals keep every digit."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


class ExactJSONRequest(Request):
    """A request whose JSON body has its fractional numbers as Decimals (pydantic then checks
    money's digits as sent; float fields take a Decimal as well)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_float=Decimal)
        return self._json
