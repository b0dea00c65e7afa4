"""``/admin/v1/prices``: USD per 1M prompt / completion / cached prompt tokens, per model."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.convertors import PathConvertor, register_url_convertor

from admin.api.deps import ContextDep, ReadDep, WriteBareDep, WriteDep
from admin.management import price_view, priced_model
from admin.schemas import InvalidField, PriceSet, model_name_refusal


class AnyPathConvertor(PathConvertor):
    """``path`` with line breaks too (Starlette's ``.*`` stops at one): a model name holding one
    reaches the name's check, a 400 naming it, rather than a 404 for an unknown URL (found by QA)."""

    regex = r"[\s\S]*"


register_url_convertor("anypath", AnyPathConvertor())


def add_routes(router: APIRouter) -> None:
    @router.get("/prices")
    async def list_prices(ops: ReadDep) -> dict:
        return {"object": "list", "data": [price_view(p) for p in await ops.prices()]}

    @router.put("/prices/{model:anypath}")
    async def set_price(model: str, body: PriceSet, ops: WriteDep, ctx: ContextDep) -> dict:
        return price_view(await ops.set_price(model=priced_model(ctx.settings, model),
                                              prompt_usd_per_1m=body.prompt_usd_per_1m,
                                              completion_usd_per_1m=body.completion_usd_per_1m,
                                              cached_prompt_usd_per_1m=body.cached_prompt_usd_per_1m))

    @router.delete("/prices/{model:anypath}")
    async def delete_price(model: str, ops: WriteBareDep, ctx: ContextDep) -> dict:
        """The model then costs 0 (as a model without a price does); rows already billed keep their cost."""
        if (why := model_name_refusal(model)) is not None:  # as PUT answers it (a re-check: "no price", a 404)
            raise InvalidField(f"model: {why}", "model")
        row = await ops.delete_price(priced_model(ctx.settings, model))
        return {**price_view(row), "deleted": True}
