"""``Price.cost`` (and ``cost_units``, the same in 1e-8 USD units): integer arithmetic where the
prices allow it, the Decimal formula otherwise; both must give the same value (and 8-decimal form)."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_UP, Decimal

import pytest

from gateway.pricing import MILLION, USD_QUANTUM, Price, usd_to_units


def _decimal_cost(price: Price, prompt: int, completion: int) -> Decimal:
    raw = (price.prompt_usd_per_1m * prompt + price.completion_usd_per_1m * completion) / MILLION
    return raw.quantize(USD_QUANTUM, rounding=ROUND_HALF_UP)


def test_integer_costs_equal_the_decimal_formula() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        price = Price(Decimal(rng.randint(0, 10**11)).scaleb(-8), Decimal(rng.randint(0, 10**6)).scaleb(-rng.choice((0, 2, 8))))
        assert price._units_e8 is not None
        prompt, completion = rng.randint(0, 10**6), rng.randint(0, 10**5)
        got, want = price.cost(prompt, completion), _decimal_cost(price, prompt, completion)
        assert got == want and str(got) == str(want), (price, prompt, completion)
        assert price.cost_units(prompt, completion) == usd_to_units(want)  # what the quota ledger counts


@pytest.mark.parametrize(("prompt", "completion", "want"), [
    (0, 0, "0E-8"),
    (1, 0, "0.00000015"),  # 0.15 USD per 1M prompt tokens: 1.5e-7, exactly
    (1, 1, "0.00000075"),  # + 0.6 USD per 1M completion tokens
    (3, 0, "0.00000045"),
    (1_000_000, 1_000_000, "0.75000000"),
])
def test_known_costs(prompt: int, completion: int, want: str) -> None:
    got = Price(Decimal("0.15"), Decimal("0.6")).cost(prompt, completion)
    assert got == Decimal(want) and got.as_tuple().exponent == -8  # the MONEY column's scale


def test_half_a_unit_rounds_up() -> None:
    price = Price(Decimal("0.005"), Decimal(0))  # 5e-9 USD a token: half of the smallest unit
    assert price.cost(1, 0) == Decimal("0.00000001")
    assert price.cost(1, 0) == _decimal_cost(price, 1, 0)


@pytest.mark.parametrize("price", [
    Price(Decimal("0.000000001"), Decimal(1)),  # finer than the table's scale
    Price(Decimal(-1), Decimal(1)),
])
def test_other_prices_take_the_decimal_formula(price: Price) -> None:
    assert price._units_e8 is None
    assert price.cost(12_345, 678) == _decimal_cost(price, 12_345, 678)
    assert price.cost_units(12_345, 678) == usd_to_units(_decimal_cost(price, 12_345, 678))


@pytest.mark.parametrize(("prompt", "completion"), [(-5, 10), (10, -5), (-1, -1)])
def test_negative_counts_take_the_decimal_formula(prompt: int, completion: int) -> None:
    price = Price(Decimal("0.15"), Decimal("0.6"))
    assert price.cost(prompt, completion) == _decimal_cost(price, prompt, completion)
    assert price.cost_units(prompt, completion) == usd_to_units(_decimal_cost(price, prompt, completion))


def test_prices_compare_by_their_values() -> None:
    assert Price(Decimal("1.5"), Decimal(2)) == Price(Decimal("1.50"), Decimal("2.0"))
    assert len({Price(Decimal("1.5"), Decimal(2)), Price(Decimal("1.50"), Decimal("2.0"))}) == 1


def test_cached_prompt_tokens_at_their_own_price() -> None:
    price = Price(Decimal("1.25"), Decimal("10"), Decimal("0.125"))  # cached input at a tenth
    assert price.cost(1000, 100, 600) == Decimal("0.001575")  # 400 x 1.25 + 600 x 0.125 + 100 x 10, per 1M
    assert price.cost_units(1000, 100, 600) == 157_500
    # unset: cached tokens cost what other prompt tokens do, as before
    assert Price(Decimal("1.25"), Decimal("10")).cost(1000, 100, 600) == Price(Decimal("1.25"), Decimal("10")).cost(1000, 100)
    assert price.cost(1000, 100, 5000) == price.cost(1000, 100, 1000)  # never more cached tokens than the prompt's
    assert price.cost(1000, 100, -3) == price.cost(1000, 100)


def test_cached_prices_integer_and_decimal_agree() -> None:
    rng = random.Random(11)
    for _ in range(5_000):
        fine = rng.random() < 0.2  # finer than the table's scale: the Decimal formula
        price = Price(Decimal(rng.randint(0, 10**9)).scaleb(-8), Decimal(rng.randint(0, 10**9)).scaleb(-8),
                      Decimal(rng.randint(0, 10**9)).scaleb(-10 if fine else -8))
        assert (price._units_e8 is None) == (fine and price.cached_prompt_usd_per_1m.scaleb(8) % 1 != 0)
        prompt, completion = rng.randint(0, 10**6), rng.randint(0, 10**5)
        cached = rng.randint(0, prompt)
        raw = (price.prompt_usd_per_1m * (prompt - cached) + price.cached_prompt_usd_per_1m * cached
               + price.completion_usd_per_1m * completion) / MILLION
        want = raw.quantize(USD_QUANTUM, rounding=ROUND_HALF_UP)
        assert price.cost(prompt, completion, cached) == want
        assert price.cost_units(prompt, completion, cached) == usd_to_units(want)
