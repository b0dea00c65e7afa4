"""JSON Schema ``format`` names as anchored patterns (compiled by ``engine.json_regex``)."""

from __future__ import annotations

# dates and times as the common parsers take them (Python's datetime, pydantic): years 0001-9999,
# the day checked against the month and February 29 only in leap years, no leap second, at most 9
# digits of a second's fraction (a small model otherwise writes digits until its token limit)
_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)")
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_SECS = r"\d+(?:\.\d+)?S"
_DUR_DATE = r"(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)"
_DUR_TIME = rf"T(?:\d+H(?:\d+M)?(?:{_SECS})?|\d+M(?:{_SECS})?|{_SECS})"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    # RFC 3986's IPv6address, one alternative per position of the "::"
    alts = [rf"(?:{_H16}:){{6}}{_LS32}", rf"::(?:{_H16}:){{5}}{_LS32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):
        head = rf"(?:(?:{_H16}:){{0,{before}}}{_H16})?"
        alts.append(rf"{head}::(?:{_H16}:){{{after}}}{_LS32}")
    alts.append(rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}")
    alts.append(rf"(?:(?:{_H16}:){{0,6}}{_H16})?::")
    return "(?:" + "|".join(alts) + ")"


_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",  # (not RFC 3339's space: jsonschema's validator refuses it)
    "duration": rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)",
    "email": rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~.-]+@{_LABEL}(?:\.{_LABEL})+",
    "hostname": rf"{_LABEL}(?:\.{_LABEL})*",
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "uuid": r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    # pydantic's UUID1/3/4/5: that version, RFC 4122's variant
    **{f"uuid{v}": rf"[0-9A-Fa-f]{{8}}-[0-9A-Fa-f]{{4}}-{v}[0-9A-Fa-f]{{3}}-[89ABab][0-9A-Fa-f]{{3}}-[0-9A-Fa-f]{{12}}"
       for v in (1, 3, 4, 5)},
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\x00-\x1f\x7f<>\"{}|\\^`]+",
}


# pydantic's bytes: ASCII, so a maxLength counts the bytes pydantic counts (found by QA: "ጚ" is one
# character and three bytes)
_FORMATS["binary"] = r"[\x00-\x7F]*"
ANNOTATIONS = ("password",)  # formats that say nothing of the text (pydantic's SecretStr)
FORMATS = (*_FORMATS, *ANNOTATIONS)


def format_pattern(name: str) -> str | None:
    """An anchored pattern for a JSON Schema ``format``; None if unknown. Dates and times are a
    subset of RFC 3339's that Python's datetime and pydantic parse (above); ``hostname`` does not
    bound the total length to 253;
    ``email`` and ``uri`` are pragmatic, not RFC 5321 / RFC 3986 grammars; ``duration`` takes
    ISO 8601 designators in order (P1Y2M3DT4H5M6.5S, P1W), a fraction only on seconds."""
    body = _FORMATS.get(name)
    return None if body is None else f"^{body}$"
