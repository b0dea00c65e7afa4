"""The checks of admin changes that need no database: ``Management`` runs them, and the CLI runs
them before it makes a new SQLite file, so a refused value leaves no empty database behind."""

from __future__ import annotations

from decimal import Decimal

from admin.schemas import InvalidField, PriceModel, PriceSet, TenantCreate, validated
from gateway import tenancy

TENANT_FIELDS = ("rpm", "tpm", "budget_tokens", "budget_usd", "period", "enabled", "cache_enabled",
                 "cache_threshold", "cache_ttl_s", "cache_max_entries")


def check_money(dialect: str, fields: dict) -> None:
    """Refuse money this database would not give back as sent. SQLite keeps NUMERIC as a 64-bit
    float that SQLAlchemy reads back at 8 decimals; PostgreSQL's NUMERIC(18, 8) holds every
    value the schemas accept."""
    if dialect != "sqlite":
        return
    for name, value in fields.items():
        if isinstance(value, Decimal) and (stored := Decimal(f"{float(value):.8f}")) != value:
            raise InvalidField(f"{name}: SQLite keeps money as a 64-bit float and would store {value} as "
                               f"{stored}; use fewer digits, or PostgreSQL", name)


def checked_new_tenant(dialect: str, *, name: str, **fields: object) -> dict:
    """A new tenant's name and fields as sent, checked (``InvalidField``)."""
    only(fields, TENANT_FIELDS)
    fields = validated(TenantCreate, {"name": name, **fields}).changes()
    check_money(dialect, fields)
    return fields


def checked_price(dialect: str, *, model: str, prompt_usd_per_1m: Decimal | float | str,
                  completion_usd_per_1m: Decimal | float | str,
                  cached_prompt_usd_per_1m: Decimal | float | str | None = None) -> PriceSet:
    validated(PriceModel, {"model": model})
    price = validated(PriceSet, {"prompt_usd_per_1m": prompt_usd_per_1m,
                                 "completion_usd_per_1m": completion_usd_per_1m,
                                 "cached_prompt_usd_per_1m": cached_prompt_usd_per_1m})
    check_money(dialect, price.model_dump())
    return price


def only(fields: dict, allowed: tuple[str, ...]) -> None:
    """Refuse fields outside ``allowed`` (a caller's mistake: ``TenancyError``)."""
    unknown = set(fields) - set(allowed)
    if unknown:
        raise tenancy.TenancyError(f"unknown tenant field(s): {', '.join(sorted(unknown))}")
