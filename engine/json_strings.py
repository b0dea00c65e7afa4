"""A JSON string's bytes as characters, for the rules of ``engine.json_scalars``: a decoder that
reads UTF-8 (RFC 3629) and JSON's escapes (surrogate pairs joined) one byte at a time, saying
which code points a partial character can still become; and a vocabulary's plain-text tokens as
characters, the form ``StringRules.plain_mask`` runs a pattern's automaton over."""

from __future__ import annotations

from dataclasses import dataclass

import torch

CLOSE = -1  # string_byte's event for the closing quote
_ESCAPED = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09}
_UTF8_LEADS = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def string_byte(dec: object, b: int) -> tuple[object, int | None] | None:  # noqa: C901, PLR0911 - a byte's cases
    """A JSON string's next byte: (the decoder's state, the code point it completes or CLOSE or
    None), or None when ``b`` cannot come next. ``dec``: 0 between characters; ("u", left, low,
    high, bits) inside a UTF-8 character; "\\\\" after a backslash; ("x", left, value, high
    surrogate) inside ``\\uXXXX``; ("\\\\u", high surrogate) between the two escapes of a pair."""
    if dec == 0:
        if b == 0x22:
            return 0, CLOSE
        if b == 0x5C:
            return "\\", None
        if b < 0x20:
            return None
        if b < 0x80:
            return 0, b
        if 0xC2 <= b <= 0xDF:
            return ("u", 1, 0x80, 0xBF, b & 0x1F), None
        if 0xE0 <= b <= 0xF4:
            low, high = _UTF8_LEADS.get(b, (0x80, 0xBF))
            return ("u", 2 if b <= 0xEF else 3, low, high, b & (0x0F if b <= 0xEF else 0x07)), None
        return None
    if dec == "\\":
        if b == 0x75:
            return ("x", 4, 0, None), None
        cp = _ESCAPED.get(b)
        return None if cp is None else (0, cp)
    kind = dec[0]
    if kind == "u":
        _, left, low, high, bits = dec
        if not low <= b <= high:
            return None
        bits = bits << 6 | (b & 0x3F)
        return (0, bits) if left == 1 else (("u", left - 1, 0x80, 0xBF, bits), None)
    if kind == "x":
        _, left, value, pending = dec
        digit = int(chr(b), 16) if chr(b) in "0123456789abcdefABCDEF" else -1
        if digit < 0:
            return None
        value = value * 16 + digit
        if left > 1:
            return ("x", left - 1, value, pending), None
        if pending is not None:
            return (0, 0x10000 + ((pending - 0xD800) << 10) + (value - 0xDC00)) if 0xDC00 <= value <= 0xDFFF else None
        if 0xD800 <= value <= 0xDBFF:
            return ("\\u", value), None
        return None if 0xDC00 <= value <= 0xDFFF else (0, value)
    if kind == "\\u":  # a high surrogate's escape: the low one's "\\u" must follow
        return (("\\u2", dec[1]), None) if b == 0x5C else None
    return (("x", 4, 0, dec[1]), None) if b == 0x75 else None  # "\\u2": after its backslash


def pending_chars(dec: object) -> list[tuple[int, int]]:
    """The code points a decoder state can still complete, as ranges."""
    if dec == "\\":
        return [(0, 0x10FFFF)]
    kind = dec[0]
    if kind == "u":
        _, left, low, high, bits = dec
        shift = 6 * (left - 1)
        return [((bits << 6 | (low & 0x3F)) << shift, ((bits << 6 | (high & 0x3F)) << shift) | ((1 << shift) - 1))]
    if kind == "x":
        _, left, value, pending = dec
        shift = 4 * left
        low, high = value << shift, (value << shift) | ((1 << shift) - 1)
        if pending is not None:  # the low half of a pair
            low, high = max(low, 0xDC00), min(high, 0xDFFF)
            base = 0x10000 + ((pending - 0xD800) << 10) - 0xDC00
            return [(base + low, base + high)] if low <= high else []
        ranges = [(a, b) for a, b in ((low, min(high, 0xD7FF)), (max(low, 0xE000), high)) if a <= b]
        first, last = max(low, 0xD800), min(high, 0xDBFF)
        if first <= last:  # high surrogates: characters past U+FFFF, written as a pair
            ranges.append((0x10000 + ((first - 0xD800) << 10), 0x10000 + ((last - 0xD800) << 10) + 0x3FF))
        return ranges
    base = 0x10000 + ((dec[1] - 0xD800) << 10)  # between the two escapes of a pair
    return [(base, base + 0x3FF)]


@dataclass(frozen=True, slots=True)
class PlainTokens:
    """A vocabulary's plain-text tokens (``engine.json_masks``) for ``StringRules.plain_mask``:
    their ids, longest first, their lengths in characters, and per position j the code points of
    those at least j+1 characters long."""

    ids: torch.Tensor
    lengths: torch.Tensor
    columns: tuple[torch.Tensor, ...]
    width: int

    @classmethod
    def of(cls, texts: dict[int, str], width: int) -> PlainTokens:
        order = sorted(texts, key=lambda i: -len(texts[i]))
        lengths = [len(texts[i]) for i in order]
        longest = lengths[0] if order else 0
        # (every text as UTF-32, padded to the longest: one buffer read as a [tokens, longest] matrix)
        data = b"".join(texts[i].encode("utf-32-le").ljust(4 * longest, b"\0") for i in order)
        matrix = torch.frombuffer(bytearray(data), dtype=torch.int32).reshape(len(order), longest) \
            if order else torch.zeros((0, 0), dtype=torch.int32)
        at_least = torch.tensor(lengths, dtype=torch.int64)
        columns = tuple(matrix[:int((at_least > j).sum()), j].long() for j in range(longest))
        return cls(torch.tensor(order, dtype=torch.int64), at_least, columns, width)
