"""``logit_bias`` over HTTP with the official ``openai`` client: a token biased by +100 is the
answer, -100 keeps the model's own choice out, the values are checked as OpenAI checks them, and
the semantic cache keys on the bias (a stored unbiased answer never serves a biased request)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.test_api_validation import assert_error, chat, post

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]


def _token_id(api, text: str) -> int:  # noqa: ANN001
    ids = api.app.state.pagegate.engine.encode(text)
    assert len(ids) == 1, ids
    return ids[0]


def test_a_biased_token_is_the_answer_and_a_banned_one_is_not(api) -> None:  # noqa: ANN001
    client = api.openai()
    plain = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=1, temperature=0,
                                           logprobs=True)
    own = plain.choices[0].logprobs.content[0].token  # the model's own first token
    forced = _token_id(api, " maybe")
    resp = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=3, temperature=0,
                                          logit_bias={str(forced): 100})
    assert resp.choices[0].message.content == " maybe maybe maybe"
    banned = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=1, temperature=0,
                                            logit_bias={str(_token_id(api, own)): -100}, logprobs=True,
                                            top_logprobs=1)
    entry = banned.choices[0].logprobs.content[0]
    assert entry.token != own
    assert entry.top_logprobs[0].token == own  # the logprobs stay the model's own: it still leads them
    streamed = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=2, temperature=0.8,
                                              seed=1, logit_bias={str(forced): 100}, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == " maybe maybe"


def test_text_completions_take_it_too(api) -> None:  # noqa: ANN001
    client = api.openai()
    forced = _token_id(api, " Paris")
    resp = client.completions.create(model=api.model, prompt="My favourite city is", max_tokens=2, temperature=0,
                                     logit_bias={str(forced): 100}, n=2)
    assert [c.text for c in resp.choices] == [" Paris Paris"] * 2


@pytest.mark.parametrize(("bias", "words"), [  # each a 400 in both endpoints
    ({"hello": 5}, "token ids"),
    ({"-3": 5}, "token ids"),
    ({"12": 100.5}, "between -100 and 100"),
    ({"12": "5"}, "valid number"),  # a string where a number belongs (param: logit_bias.12)
    ({str(i): 1 for i in range(1025)}, "at most 1024"),
    ({"999999": 1}, "Maximum value is"),
    ({"5" * 5000: 1}, "keys are token ids"),  # (int() of it would fail with Python's own words)
])
def test_bad_biases_are_400s_naming_logit_bias(api, bias, words) -> None:  # noqa: ANN001
    err = assert_error(post(api, "/v1/chat/completions", chat(api, logit_bias=bias)), 400, param="<any>")
    assert err["param"].startswith("logit_bias") and words in err["message"], err
    assert "Value error" not in err["message"] and len(err["message"]) < 300
    with pytest.raises(openai.BadRequestError):
        api.openai().completions.create(model=api.model, prompt="Hi", max_tokens=1, logit_bias=bias)


def test_the_semantic_cache_keys_on_the_bias(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _, key = api.make_tenant()
    client = api.openai(key)
    forced = str(_token_id(api, " maybe"))
    ask = lambda **kw: client.chat.completions.with_raw_response.create(  # noqa: E731
        model=api.model, messages=MESSAGES, max_tokens=2, temperature=0, **kw)
    assert ask().headers["x-cache"] == "miss"
    biased = ask(logit_bias={forced: 100})
    assert biased.headers["x-cache"] == "miss"  # not the stored unbiased answer
    assert biased.parse().choices[0].message.content == " maybe maybe"
    again = ask(logit_bias={"0" + forced: 100.0})  # the same bias spelled otherwise: the same entry
    assert again.headers["x-cache"] == "hit"
    assert again.parse().choices[0].message.content == " maybe maybe"
