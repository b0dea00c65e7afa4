"""What a tenant is told when its quota or token-rate window refuses or limits a request (for
``gateway.quota``): the messages, when a request would fit again, the ``x-ratelimit-*-tokens``
headers, and dollar amounts as the messages write them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from gateway.auth import Principal
from gateway.errors import ApiError, insufficient_quota, rate_limited
from gateway.limits import format_reset
from gateway.pricing import units_to_usd, usd_to_units


def tpm_wait_s(limit: int, prev: int, cur: int, frac: float, need: int) -> float:
    """Seconds until ``need`` more tokens fit the sliding TPM window, if nothing else is charged
    meanwhile. The window counts ``floor(prev * (1 - frac) + cur)`` (``frac``: the elapsed fraction
    of this minute; ``quota_reserve.lua``), so ``need`` fits once that sum is below
    ``limit - need + 1``: the previous minute's tokens drain linearly until the minute ends, then
    this minute's become the previous ones and drain in turn. ``need`` over ``limit`` never fits:
    the time until the window is empty."""
    left_s = 60.0 * (1.0 - frac)
    if need > limit:
        return left_s + 60.0
    room = limit - need + 1  # the sum must end below this
    if cur + need <= limit:  # before this minute ends, as the previous minute's tokens drain
        return 0.0 if prev <= 0 else max(0.0, 60.0 * (1.0 - frac - (room - cur) / prev))
    return left_s + 60.0 * max(0.0, 1.0 - room / cur)  # in the next minute, as this one's drain


def tpm_empty_s(prev: int, cur: int, frac: float) -> float:
    """Seconds until the sliding TPM window counts nothing again, if nothing else is charged (what
    OpenAI's ``x-ratelimit-reset-tokens`` says: the time until the limit is back to full): this
    minute's tokens count, fading, until the next minute ends; the previous minute's until this one
    does."""
    if cur > 0:
        return 60.0 * (1.0 - frac) + 60.0
    return 60.0 * (1.0 - frac) if prev > 0 else 0.0


# A refusal that only requests in flight cause (their reservations hold the room until they
# finish, seconds at most): retried this soon, by the openai SDKs too.
IN_FLIGHT_RETRY_S = 1.0
_OR_MAX_TOKENS = {True: ", or send max_tokens", False: ""}
_IN_FLIGHT_WHY = ("each holds its max_tokens until it finishes and gives back what it did not use; one sent "
                  "without max_tokens holds all the room its context leaves; one whose gateway process was "
                  "killed is given back within about a minute")


def tpm_refusal(limit: int, used: int, prev: int, cur: int, frac: float, requested: int,
                held: int = 0, *, completes: bool = True) -> ApiError:
    """429 for a request that does not fit the TPM window: its ``retry-after`` and
    ``x-ratelimit-reset-tokens`` say when it would (other traffic may take that room first).
    ``held``: the window's tokens that open reservations hold (requests in flight); a request that
    would fit without them is told so and to retry in a second, when they have given back what
    they did not use. ``completes``: the request asks for completion tokens (an embedding asks for
    none: no advice to send ``max_tokens``)."""
    if requested > limit:  # never fits: no retry-after, and the window's reset as an accepted request sees it
        return rate_limited(f"Request too large for tokens per minute: limit {limit}, requested {requested}. "
                            f"Send fewer tokens.", retry_after_s=None,
                            headers=tpm_headers(limit, used, format_reset(tpm_empty_s(prev, cur, frac))))
    held = max(0, min(held, used))
    if held and used - held + requested <= limit:
        headers = tpm_headers(limit, used, format_reset(IN_FLIGHT_RETRY_S))
        return rate_limited(f"Rate limit reached for tokens per minute: limit {limit}, used {used}, of which {held} "
                            f"are reserved by your requests in flight ({_IN_FLIGHT_WHY}); requested {requested}. It "
                            f"may fit once they finish: please try again in a second{_OR_MAX_TOKENS[completes]}.",
                            retry_after_s=IN_FLIGHT_RETRY_S, headers=headers)
    wait_s = tpm_wait_s(limit, prev, cur, frac, requested) + 0.001  # just past the moment it fits
    reset = format_reset(wait_s)
    headers = tpm_headers(limit, used, reset)
    return rate_limited(f"Rate limit reached for tokens per minute: limit {limit}, used {used}, requested "
                        f"{requested}. Please try again in {reset}.", retry_after_s=wait_s, headers=headers)


def tpm_headers(limit: int, used: int, reset: str) -> dict[str, str]:
    """``reset``: already formatted (``format_reset``), once per batch."""
    return {
        "x-ratelimit-limit-tokens": str(limit),
        "x-ratelimit-remaining-tokens": str(max(0, limit - used)),
        "x-ratelimit-reset-tokens": reset,
    }


def quota_refusal(p: Principal, tok_used: int, usd_units: int, need: int, need_units: int, period_end: datetime,
                  *, retry_after_s: float, held_tok: int = 0, held_units: int = 0, completes: bool = True) -> ApiError:
    """429 ``insufficient_quota``. ``need``: the fewest tokens the request could be served with (its
    prompt and one per choice), costing ``need_units`` (1e-8 USD); more than the whole token or
    money budget, it can never fit: said so, with ``x-should-retry: false`` and no ``retry-after``. A
    budget of 0 refuses every request, whatever it costs (a free model's too), in every period.
    ``held_tok``/``held_units``: of ``tok_used``/``usd_units``, what open reservations hold (requests
    in flight). A request that the budget's spent part leaves room for is refused only until they
    finish: 429 ``rate_limit_exceeded``, retried in a second (found by QA: five concurrent requests
    without ``max_tokens`` each held ~8,000 tokens of a 20,000-token budget, and two were told the
    month's quota was used up, retry in 27 days). A refusal for the rest of the period says
    ``x-should-retry: false`` when the period ends more than a minute later (the openai SDKs would
    retry it twice in vain)."""
    zero = [text for budget, text in ((p.budget_tokens, "0 tokens"), (p.budget_usd, "$0"))
            if budget is not None and Decimal(budget) == 0]
    if zero:  # no retry-after: no period has room
        return insufficient_quota(f"Your budget is {' and '.join(zero)} a {p.budget_period}: every request is "
                                  "refused until it is raised.", retry_after_s=None)
    never = None
    if p.budget_tokens is not None and need > p.budget_tokens:
        never = f"more than the whole budget of {p.budget_tokens} tokens a {p.budget_period}"
    elif p.budget_usd is not None and need_units > usd_to_units(Decimal(p.budget_usd)):
        never = (f"costing ${units_to_usd(need_units).normalize():f}, more than the whole budget of "  # exact:
                 f"${Decimal(p.budget_usd).normalize():f} a {p.budget_period}")  # rounded, they could read equal
    if never is not None:  # no retry-after: a later period does not help
        return insufficient_quota(
            f"This request needs at least {need} tokens (its prompt and one per choice), {never}: send a "
            "shorter prompt, or fewer prompts or choices.", retry_after_s=None)
    held_tok, held_units = max(0, min(held_tok, tok_used)), max(0, min(held_units, usd_units))
    if (held_tok or held_units) and _fits(p, tok_used - held_tok, usd_units - held_units, need, need_units):
        return rate_limited(
            f"Your requests in flight hold the rest of your budget for this {p.budget_period}: "
            f"{describe_budget(p, tok_used, usd_units, held_tok, held_units)} ({_IN_FLIGHT_WHY}). This request "
            f"may fit once they finish: please try again in a second{_OR_MAX_TOKENS[completes]}.",
            retry_after_s=IN_FLIGHT_RETRY_S)
    err = insufficient_quota(
        f"You exceeded your current quota for this {p.budget_period}: "
        f"{describe_budget(p, tok_used, usd_units, held_tok, held_units)}; this request needs at least "
        f"{_need(p, tok_used, usd_units, need, need_units)}. It resets at {period_end:%Y-%m-%d %H:%M} UTC.",
        retry_after_s=retry_after_s)
    if retry_after_s > 60:
        err.headers["x-should-retry"] = "false"
    return err


def _need(p: Principal, tok_used: int, usd_units: int, need: int, need_units: int) -> str:
    """What the request needs against what is left, for the budget that refuses it: a money budget's
    refusal said only tokens, and the rounded spend ("$0.0099 of $0.01") left the customer guessing
    what remained (found by QA)."""
    if p.budget_usd is None or (p.budget_tokens is not None and tok_used + need > p.budget_tokens):
        return f"{need} tokens, and {max(0, (p.budget_tokens or 0) - tok_used)} are left"
    left = max(0, usd_to_units(Decimal(p.budget_usd)) - usd_units)
    return (f"{need} tokens costing ${units_to_usd(need_units).normalize():f}, and "
            f"${units_to_usd(left).normalize():f} is left")


def _fits(p: Principal, tok_spent: int, units_spent: int, need: int, need_units: int) -> bool:
    if p.budget_tokens is not None and tok_spent + need > p.budget_tokens:
        return False
    return p.budget_usd is None or units_spent + need_units <= usd_to_units(Decimal(p.budget_usd))


def describe_budget(p: Principal, tok_used: int, usd_units: int, held_tok: int = 0, held_units: int = 0) -> str:
    """What the budget's counter holds: "… of … used", or "… used and … reserved of …" with requests
    in flight."""
    parts = []
    if p.budget_tokens is not None:
        if held_tok:
            parts.append(f"{tok_used - held_tok} used and {held_tok} reserved of {p.budget_tokens} tokens")
        else:
            parts.append(f"{tok_used} of {p.budget_tokens} tokens used")
    if p.budget_usd is not None:
        spent, budget = units_to_usd(usd_units - held_units), Decimal(p.budget_usd)
        shown, of = format_usd(spent), format_usd(budget)
        if shown == of and spent != budget:  # rounded alike ($0.00003 of $0.00003): the ledger's digits
            shown = f"${spent.normalize():f}"
        if held_units:
            parts.append(f"{shown} used and {format_usd(units_to_usd(held_units))} reserved of {of}")
        else:
            parts.append(f"{shown} of {of} used")
    return ", ".join(parts) or "budget exhausted"


def format_usd(value: Decimal) -> str:
    """Dollars to the cent, or to two significant digits for an amount under a dollar (down to the
    ledger's 1e-8): $12.35, $0.50, $0.0042, $0.00002."""
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    places = max(2, min(8, -value.copy_abs().adjusted() + 1))
    whole, _, frac = f"{value:.{places}f}".partition(".")
    return f"${whole}.{frac.rstrip('0').ljust(2, '0')}"
