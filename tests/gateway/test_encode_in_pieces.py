"""``encode_in_pieces``: a whole answer with many logprobs encoded in pieces (the event loop gets
the GIL between them) is the same JSON as pydantic's one call."""

from __future__ import annotations

import json
import random

from gateway.formats import (
    PIECE_ITEMS,
    ChatFormat,
    CompletionFormat,
    TokenNames,
    encode_in_pieces,
    make_usage,
)


def _names() -> TokenNames:
    return TokenNames(lambda ids: [f'tok{i} é"'.encode() if i % 7 else bytes([0xF0, 0x9F]) for i in ids])


def _entries(rng: random.Random, n: int, k: int) -> list:
    return [(rng.randrange(500), -rng.random() * 5, [(rng.randrange(500), -rng.random() * 5) for _ in range(k)])
            for _ in range(n)]


def test_the_pieces_make_pydantics_json() -> None:
    rng = random.Random(4)
    n = PIECE_ITEMS * 3 + 17  # several pieces and a short last one
    texts = ['a "logprobs":null in the text', "b\n\u2028", "c"]  # the key's text inside a string is not the key
    completion = CompletionFormat(model="m", token_names=_names(), echo=("p1", "p1", "p2"), scored=True)
    prompt_first = [(5, None, None)]  # an echoed prompt's first token: nulls
    whole = completion.response(texts, ["length", "stop", None], make_usage(3, 4, 0),
                                [prompt_first + _entries(rng, n, 5), _entries(rng, 3, 0), []])
    assert json.loads(encode_in_pieces(whole)) == json.loads(whole.model_dump_json())
    chat = ChatFormat(model="m", token_names=_names())
    answer = chat.response(texts[:2], ["stop", "length"], make_usage(3, 4, 0), [_entries(rng, n, 20), []])
    assert json.loads(encode_in_pieces(answer)) == json.loads(answer.model_dump_json())
    plain = chat.response(["x"], ["stop"], make_usage(1, 1, 0), None)
    assert encode_in_pieces(plain) == plain.model_dump_json().encode()
