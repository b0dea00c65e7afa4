"""The database schema (SQLAlchemy 2). It changes only through migrations in ``migrations/``."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

MONEY = Numeric(18, 8)


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    rpm_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)  # requests / minute
    tpm_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)  # tokens / minute
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_usd: Mapped[Decimal | None] = mapped_column(MONEY, nullable=True)
    budget_period: Mapped[str] = mapped_column(String(16), default="month")  # day | month
    cache_enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    cache_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    cache_ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cache_max_entries: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )
    # set when an admin deletes the tenant: its keys are revoked, the row and usage kept (migration 0002)
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the full key
    prefix: Mapped[str] = mapped_column(String(16), index=True)  # shown in lists, e.g. "pg-AbC123"
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # None: all
    rpm_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    tenant: Mapped[Tenant] = relationship(back_populates="keys")


class ModelPrice(Base):
    __tablename__ = "model_prices"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    prompt_usd_per_1m: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    completion_usd_per_1m: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    # prompt tokens served from the prefix cache; null: billed as other prompt tokens
    cached_prompt_usd_per_1m: Mapped[Decimal | None] = mapped_column(MONEY, nullable=True, default=None)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class UsageRecord(Base):
    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_tenant_time", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)  # idempotent spool replay
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"), nullable=True)
    model: Mapped[str] = mapped_column(String(128))
    endpoint: Mapped[str] = mapped_column(String(32), default="chat.completions")
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)  # from the engine's prefix cache
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    saved_usd: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))  # cost a cache hit avoided
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(32))  # ok | error | aborted | ...
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    cache: Mapped[str] = mapped_column(String(16), default="miss")  # hit | semantic-hit | miss | bypass


class AuditLog(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)
    actor: Mapped[str] = mapped_column(Text)  # JWT subject, or "cli" (whole: migration 0003)
    action: Mapped[str] = mapped_column(String(64))  # e.g. tenant.update, key.revoke
    target: Mapped[str] = mapped_column(Text)  # e.g. tenant:NAME, model:NAME
    before: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
