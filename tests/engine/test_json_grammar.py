"""JSON mode's recognizer and masks (``engine.json_grammar``), checked against Python's own JSON
parser: every prefix of a JSON object is accepted and only the whole object is complete; random
byte strings are complete exactly when ``json.loads`` reads them as an object; a mask allows
exactly the tokens whose bytes the state accepts, also where its cache key cuts the stack."""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine import json_grammar as g
from engine.json_masks import JsonVocabulary


def _random_value(rng: random.Random, depth: int = 0):  # noqa: ANN202
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([0, -1, 7, 123456789, -0.5, 3.25e-7, 1e300, 2.5e10])
    if kind == 1:
        return rng.choice(["", "plain", 'q"uote', "back\\slash", "tab\tnew\nline", "\x01ctl", "é 日本 🙂", "\u2028"])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return rng.choice(["x", "y"]) * rng.randint(1, 3)
    if kind in (5, 6):
        return {f"k{i}{rng.choice(['', 'é', ' '])}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _random_object(rng: random.Random) -> bytes:
    obj = {f"key{i}": _random_value(rng) for i in range(rng.randint(0, 4))}
    indent = rng.choice([None, None, 0, 2, 4])
    separators = rng.choice([None, (",", ":"), (", ", ": ")])
    text = json.dumps(obj, indent=indent, separators=separators, ensure_ascii=rng.random() < 0.5)
    return (rng.choice(["", " ", "\n"]) + text + rng.choice(["", "\n"])).encode()


def test_every_prefix_of_a_json_object_is_accepted_and_only_the_whole_is_complete() -> None:
    rng = random.Random(0)
    for _ in range(300):
        data = _random_object(rng)
        state = g.INITIAL
        done_at = None
        for i, b in enumerate(data):
            state = g.step(state, b)
            assert state is not None, (data, i)
            if done_at is None and g.is_complete(state):
                done_at = i
        assert g.is_complete(state), data
        assert data[done_at:].strip() == b"}", (data, done_at)  # complete exactly when the object closes


@pytest.mark.parametrize("text", [
    "[]", "1", '"a"', "true",  # JSON, but not an object
    '{"a":NaN}', '{"a":Infinity}',  # Python's json reads these; JSON has no such values
    '{"a":01}', '{"a":1,}', "{a:1}", '{"a":tru}', '{"a":1}}', '{"a":-}', '{"a":1.}', '{"a":"\\x"}',
    '{"a":"\\u12G4"}', '{"a":"\x01"}', '{"a" 1}', '{,}', '{"a":[1 2]}', '{"a":.5}', '{"a":+1}', '{"a":1e}',
    "{'a':1}", '{"a":1}x',
])
def test_what_is_not_a_json_object_is_refused(text: str) -> None:
    state = g.accepts(text.encode())
    assert state is None or not g.is_complete(state)


def random_edits(rng: random.Random, text: str, pieces: list[str], edits: int) -> str:
    """``text`` with ``edits`` random edits: a character deleted, a piece inserted or put in a
    character's place."""
    for _ in range(edits):
        at = rng.randrange(len(text) + 1)
        edit = rng.randrange(3)
        if edit == 0:
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + rng.choice(pieces) + text[at + (edit == 2):]
    return text


def _strict_object(text: str) -> bool:
    def no_constant(name: str):  # noqa: ANN202
        raise ValueError(name)

    try:
        return isinstance(json.loads(text, parse_constant=no_constant), dict)
    except ValueError:
        return False


def test_mutated_objects_are_complete_exactly_when_json_reads_an_object() -> None:
    """Random objects with one to three random edits (a byte deleted, a piece inserted or put in a
    byte's place), each read by the recognizer and by Python's parser (its NaN and Infinity off)."""
    rng = random.Random(1)
    pieces = ["{", "}", "[", "]", ",", ":", '"', "a", "1", "0", "-", ".", "e", "+", "true", "null", " ", "\n", "\\",
              "\\u00e9", "\\u12", "é", "\x01", "01"]
    counts = [0, 0]
    for _ in range(6_000):
        text = random_edits(rng, _random_object(rng).decode(), pieces, rng.randint(1, 3))
        state = g.accepts(text.encode())
        valid = _strict_object(text)
        assert (state is not None and g.is_complete(state)) == valid, text
        counts[valid] += 1
    assert min(counts) > 500, counts  # both kinds were tried


def test_utf8_inside_strings_is_checked() -> None:
    assert g.accepts('{"a":"日本'.encode()) is not None
    assert g.accepts('{"a":"日'.encode()[:-1]) is not None  # a character still to finish
    assert g.accepts(b'{"a":"\xe6\x97"') is None  # the quote before the character's end
    assert g.accepts(b'{"a":"\x80') is None  # a continuation byte with no lead
    assert g.accepts(b'{"a":"\xff') is None
    assert g.accepts('{"日本":1}'.encode()) is not None  # keys too


def test_strings_hold_exactly_the_bytes_utf8_allows() -> None:
    """Random bytes inside a string (most of them past ASCII): complete exactly when they are UTF-8
    (Python's decoder: no overlong forms, surrogates or code points past U+10FFFF; found by QA:
    E0 80 80, ED A0 80 and F4 90 80 80 passed) with no quote, backslash or control character."""
    rng = random.Random(4)
    leads = [0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xF0, 0xF3, 0xF4, 0xF5, 0xC0, 0xFF]
    seen = [0, 0]
    for _ in range(20_000):
        data = bytes(rng.choice([rng.randrange(0x20, 0x7F), rng.choice(leads), rng.randrange(0x80, 0xC0)])
                     for _ in range(rng.randint(1, 6)))
        state = g.accepts(b'{"a":"' + data + b'"}')
        try:
            text = data.decode("utf-8")
            ok = not any(c in text for c in '"\\')
        except UnicodeDecodeError:
            ok = False
        assert (state is not None and g.is_complete(state)) == ok, data
        seen[ok] += 1
    assert min(seen) > 1_000, seen


def test_whitespace_runs_and_depth_are_bounded() -> None:
    assert g.accepts(b"{" + b" " * g.MAX_WHITESPACE) is not None
    assert g.accepts(b"{" + b" " * (g.MAX_WHITESPACE + 1)) is None
    assert g.accepts(b'{"a":' + b"\n" * g.MAX_WHITESPACE + b"1" + b" " * g.MAX_WHITESPACE) is not None  # per run
    assert g.accepts(b'{"a":"' + b" " * 1000) is not None  # inside a string spaces are text
    deep = b'{"a":' + b"[" * (g.MAX_DEPTH - 1)
    assert g.accepts(deep) is not None and g.accepts(deep + b"[") is None
    assert g.accepts(deep + b"1" + b"]" * (g.MAX_DEPTH - 1) + b"}")[0] == g.DONE


def _brute_force(tokens: list[bytes], state: g.State, width: int) -> torch.Tensor:
    banned = torch.ones(width, dtype=torch.bool)
    for i, data in enumerate(tokens):
        if data and g.accepts(data, state) is not None:
            banned[i] = False
    return banned


def test_masks_ban_exactly_the_tokens_the_state_refuses() -> None:
    """A vocabulary of single bytes, JSON-ish pieces, partial UTF-8 characters, strings of closers
    and an empty (special) token; states from prefixes of random objects, deep ones included (the
    cache keys cut their stacks), each mask asked twice (the second from the cache)."""
    rng = random.Random(2)
    tokens = [bytes([b]) for b in range(256)] + [
        b"", b'{"', b'":', b'": "', b'",', b'"}', b"}}", b"]]}", b"}]}", b"}}}}", b"true", b"null", b"12", b"-0.",
        b"e+", b" hello", b"\\n", b"\\u", b"00", "é".encode(), "日".encode()[:2], "日".encode()[2:], b"\n  ",
        b"   ", b'":{"', b"[[", b'\\"', b"},{", b'"]}', b"\xff",
    ]
    width = len(tokens) + 3  # ids past the vocabulary: always banned
    vocab = JsonVocabulary(tokens, width, eos_token_ids=[256])
    assert vocab.max_closers == 4
    states = []
    for _ in range(40):
        data = _random_object(rng)
        nest = b'{"deep":' + b'[{"x":' * 6
        for prefix in (data, nest + data[:-1] if data.strip() else data):
            state = g.INITIAL
            for b in prefix:
                state = g.step(state, b)
                if state is None:
                    break
                if rng.random() < 0.15:
                    states.append(state)
    assert any(len(s[1]) > vocab.max_closers + 1 for s in states)  # stacks the key cuts
    for state in states:
        expected = _brute_force(tokens, state, width)
        assert torch.equal(vocab.banned(state), expected), state
        assert torch.equal(vocab.banned(state), expected)
    assert vocab.walked < len(states)  # the cache answered some
    assert bool(vocab.banned(g.INITIAL)[len(tokens):].all()) and bool(vocab.banned(g.INITIAL)[256])


def test_masks_near_the_depth_limit_allow_no_level_past_it() -> None:
    """Found by QA: the masks' cache key cut the stack, so a mask computed a few levels deep served
    the 64th, where it still allowed "[" (which the recognizer then refused, ending the answer)."""
    tokens = [b"[", b"[[", b"{", b'{"', b"]", b"1", b"]]", b" ", b"[[[", b""]
    vocab = JsonVocabulary(tokens, len(tokens), eos_token_ids=[9])
    for depth in [*range(1, 6), *range(g.MAX_DEPTH - 5, g.MAX_DEPTH + 1)]:
        state = g.accepts(b'{"a":' + b"[" * (depth - 1))
        assert state is not None and len(state[1]) == depth
        assert torch.equal(vocab.banned(state), _brute_force(tokens, state, len(tokens))), depth
    deepest = g.accepts(b'{"a":' + b"[" * (g.MAX_DEPTH - 1))
    assert vocab.banned(deepest)[:4].tolist() == [True] * 4 and not vocab.banned(deepest)[5]


def test_a_state_no_token_may_follow_allows_eos() -> None:
    vocab = JsonVocabulary([b"a", b"b", b""], 3, eos_token_ids=[2])  # no "{" in this vocabulary
    assert vocab.banned(g.INITIAL).tolist() == [True, True, False]
    assert vocab.advance(g.INITIAL, 2) is None and vocab.advance(g.INITIAL, 7) is None
