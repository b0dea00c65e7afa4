"""What an admin change may contain: the request bodies of the admin API, also used by the CLI and
the dashboard (through ``Management``) so every surface refuses the same bad values with the same
message. Unknown fields are refused (a typo must not pass silently). Bounds are the database's:
32-bit integer columns, 64-bit token budgets, money as NUMERIC(18, 8). Counts and flags are strict
(a JSON body's ``true`` is not 1, nor ``"12"`` 12, nor ``"yes"`` true); money may be a number or a
string in plain decimal notation (``"25.5"``, not ``"1_000"`` or ``"1e3"``)."""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gateway.tenancy import RESERVED_NAME

Period = Literal["day", "month"]
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# strict in a JSON body: true, "12" and 12.0 are not counts ("yes" not a flag); ``validated`` still
# converts the text of the dashboard's form fields
Count = Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)]
Positive = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]
TokenCount = Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]
Flag = Annotated[bool, Field(strict=True)]
# Numbers written as text (CLI options, query parameters, money sent as a JSON string) are plain:
# int() and Decimal() would also take "1_000", " 5", "+5", "٣" or "1e3", which no surface documents.
# the sign only so that bounds say "must be >= 0"; "-0" is no number anyone means (found by QA: it
# passed ">= 0" and made a tenant's rpm unlimited)
WHOLE_NUMBER = re.compile(r"[0-9]+|-0*[1-9][0-9]*")
# no sign: amounts are never negative, and "-0" would pass ">= 0" and be stored as a negative zero
PLAIN_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
WHOLE_NUMBER_RULE = "must be a whole number in plain digits (0-9)"
PLAIN_DECIMAL_RULE = ("must be a plain decimal number: digits and at most one point (no sign, '_', spaces or "
                      "exponent)")


def plain_whole_number(value: object) -> object:
    """Text must be ASCII digits (optionally negative, for the bounds to refuse); other values pass."""
    if isinstance(value, str) and not WHOLE_NUMBER.fullmatch(value):
        raise ValueError(WHOLE_NUMBER_RULE)
    return value


def _plain_money(value: object) -> object:
    # only text: a JSON number is a number in any JSON form (Python's json writes 0.00001 as 1e-05)
    if isinstance(value, str) and not PLAIN_DECIMAL.fullmatch(value):
        raise ValueError(PLAIN_DECIMAL_RULE)
    return value


def _unsigned_zero(value: Decimal) -> Decimal:
    # a JSON -0.0 passes ">= 0"; stored as sent it would read back (and show) as -0.00000000
    return value.copy_abs() if value == 0 else value


# a JSON number or a string in plain decimal notation
Money = Annotated[Decimal, BeforeValidator(_plain_money), Field(ge=0, max_digits=18, decimal_places=8),
                  AfterValidator(_unsigned_zero)]
# A price per 1M tokens: $1 a token at most. The quota ledger counts money in 1e-8 USD units in
# Redis's 64-bit integers; at the 10-digit maximum of Money a single reservation passed 1e17 units
# and broke the reservation script (found by QA: a 503, and a counter charged without its entry).
MAX_PRICE_PER_1M = Decimal(1_000_000)
PRICE_RULE = "must be at most 1000000 (USD per 1M tokens, $1 a token)"


def _price_bound(value: Decimal) -> Decimal:
    if value > MAX_PRICE_PER_1M:
        raise ValueError(PRICE_RULE)
    return value


PriceMoney = Annotated[Money, AfterValidator(_price_bound)]
TENANT_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # the whole name (re.fullmatch: "$" would pass "acme\n")


def _not_null(value: object) -> object:
    if value is None:
        raise ValueError("cannot be null; leave the field out to keep its value")
    return value


# a field that always holds a value: absent keeps it, null is refused (it used to change nothing, silently)
NotNull = BeforeValidator(_not_null)


class InvalidField(ValueError):
    """A value that breaks a schema rule; ``param`` names the field (``None``: the whole body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


MONEY_RULE = "must have at most 10 digits before the point and 8 after it"
# pydantic's words for the Money bounds, which said "18 digits in total" for 1e400 or 12.000000000000000000001
# (found by QA: the rule is 10 and 8, as the README says)
_DECIMAL_BOUNDS = frozenset({"decimal_max_digits", "decimal_max_places", "decimal_whole_digits"})


def error_message(error: dict) -> str:
    """A pydantic error's message as the admin surfaces give it."""
    if error.get("type") in _DECIMAL_BOUNDS:
        return MONEY_RULE
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def validated(model: type[BaseModel], data: dict) -> BaseModel:
    """``model`` built from ``data``; the first problem is raised as ``InvalidField``. Text is
    converted (``"12"`` to 12: the dashboard's form fields are text); a JSON body is read by the
    API with the fields' own strictness."""
    try:
        return model.model_validate(data, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise InvalidField(f"{param or 'request'}: {error_message(first)}", param) from exc


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN, Infinity: "a finite number"


class TenantLimits(_Body):
    """Tenant settings; on PATCH only the fields sent change, and ``null`` clears a limit."""

    rpm: Count | None = Field(None, description="requests/minute; null: server default, 0: unlimited")
    tpm: Count | None = Field(None, description="tokens/minute; null: server default, 0: unlimited")
    budget_tokens: TokenCount | None = None
    budget_usd: Money | None = None
    period: Annotated[Period | None, NotNull] = None
    enabled: Annotated[Flag | None, NotNull] = None
    cache_enabled: Annotated[Flag | None, NotNull] = None
    cache_threshold: float | None = Field(None, strict=True, gt=0, le=1)
    cache_ttl_s: Positive | None = None
    cache_max_entries: Positive | None = None

    def changes(self) -> dict:
        """The fields the client sent."""
        return self.model_dump(exclude_unset=True)


def _tenant_name(name: str) -> str:
    if not re.fullmatch(TENANT_NAME, name):
        raise ValueError("a tenant name uses letters, digits, '.', '_' and '-', and starts with a letter or digit")
    if name.casefold() == RESERVED_NAME.casefold():
        raise ValueError(f"{name!r} is reserved: the reports' CSV names its sum line {RESERVED_NAME}")
    return name


class TenantCreate(TenantLimits):
    name: Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_tenant_name)]


class BudgetUpdate(_Body):
    budget_tokens: TokenCount | None = None
    budget_usd: Money | None = None
    period: Annotated[Period | None, NotNull] = None  # absent: kept


MODELS_RULE = "name at least one model and no empty names (null or absent: all models)"


def _model_names(models: list[str]) -> list[str]:
    # an empty list must not silently mean "all models", as null does
    if not models or any(not m.strip() for m in models):
        raise ValueError(MODELS_RULE)
    return list(dict.fromkeys(models))  # a model named twice is named once (found by QA: "x, x")


ModelNames = Annotated[list[Annotated[str, Field(max_length=128), AfterValidator(lambda m: _model_name(m))]],
                      AfterValidator(_model_names)]


def split_models(text: str) -> list[str]:
    """A comma-separated model list (CLI flag, dashboard field); ``InvalidField`` on an empty name."""
    try:
        return _model_names([_model_name(m.strip()) for m in text.split(",")])
    except ValueError as exc:
        raise InvalidField(f"allowed_models: {exc}", "allowed_models") from exc


def _printable(name: str) -> str:
    # a newline or other control character would break the CLI's tables and the audit listing; a
    # format character (a right-to-left override, a zero-width space) would show a name that is not it
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise ValueError("must not contain control, format or line-break characters")
    return name


def _model_name(name: str) -> str:
    _printable(name)
    if "\ufffd" in name:  # what bytes that are not UTF-8 become in a URL's path (found by QA: stored as such)
        raise ValueError("must be valid UTF-8 text (it holds U+FFFD, the replacement for bytes that are not)")
    if name.strip() and name != name.strip():  # (a blank one: the list's own rule says what is wrong)
        raise ValueError("must not start or end with spaces")
    return name


def model_name_refusal(name: str) -> str | None:
    """Why a model name cannot be priced (``_model_name``'s words), None when it can."""
    try:
        _model_name(name)
    except ValueError as exc:
        return str(exc)
    return None if name.strip() else "must not be blank"


def _key_name(name: str) -> str | None:
    # a blank name is no name: null, as the dashboard's empty field gives (found by QA: the API and
    # the CLI stored "", shown apart from the dashboard's null)
    return _printable(name) if name.strip() else None


class KeyCreate(_Body):
    name: Annotated[str, Field(max_length=128), AfterValidator(_key_name)] | None = None
    allowed_models: ModelNames | None = None  # null: every model
    rpm: Count | None = None


class PriceSet(_Body):
    prompt_usd_per_1m: PriceMoney
    completion_usd_per_1m: PriceMoney
    # prompt tokens served from the prefix cache; null or left out: billed as other prompt tokens
    cached_prompt_usd_per_1m: PriceMoney | None = None


class PriceModel(_Body):
    model: Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_model_name)]
