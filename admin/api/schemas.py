"""Request bodies of the admin API. Unknown fields are refused (a typo must not pass silently)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Period = Literal["day", "month"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantLimits(_Body):
    """Tenant settings; on PATCH only the fields sent change, and ``null`` clears a limit."""

    rpm: int | None = Field(None, ge=0, description="requests/minute; null: server default, 0: unlimited")
    tpm: int | None = Field(None, ge=0, description="tokens/minute; null: server default, 0: unlimited")
    budget_tokens: int | None = Field(None, ge=0)
    budget_usd: Decimal | None = Field(None, ge=0)
    period: Period | None = None
    enabled: bool | None = None
    cache_enabled: bool | None = None
    cache_threshold: float | None = Field(None, gt=0, le=1)
    cache_ttl_s: int | None = Field(None, ge=1)
    cache_max_entries: int | None = Field(None, ge=1)

    def changes(self) -> dict:
        """Fields the client sent (``period``/flags cannot be cleared to null)."""
        sent = self.model_dump(exclude_unset=True)
        for flag in ("period", "enabled", "cache_enabled"):
            if flag in sent and sent[flag] is None:
                del sent[flag]
        return sent


class TenantCreate(TenantLimits):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class BudgetUpdate(_Body):
    budget_tokens: int | None = Field(None, ge=0)
    budget_usd: Decimal | None = Field(None, ge=0)
    period: Period | None = None


class KeyCreate(_Body):
    name: str | None = Field(None, max_length=128)
    allowed_models: list[str] | None = None
    rpm: int | None = Field(None, ge=0)


class PriceSet(_Body):
    prompt_usd_per_1m: Decimal = Field(ge=0)
    completion_usd_per_1m: Decimal = Field(ge=0)
