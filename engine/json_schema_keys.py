"""An object schema's property names, matched byte by byte as the key is written
(``engine.json_schema``'s ``KEY_MATCH`` mode)."""

from __future__ import annotations

import bisect

from engine.json_schema_link import Prop


class KeyIndex:
    """An object's property names for matching the key being written: every prefix of a name to
    the properties whose names start so (ascending), and from each next-property index the last
    property that may come next (the first required one) and whether the object may close there.
    Matching a key byte is then a lookup and a bisection, whatever the number of properties (found
    by QA: a loop over 11,000 optional properties per byte held the engine 30 s)."""

    def __init__(self, props: tuple[Prop, ...]) -> None:
        self.prefixes: dict[bytes, list[int]] = {}
        self.exact: dict[bytes, int] = {}
        for j, prop in enumerate(props):
            self.exact[prop.key] = j
            for end in range(len(prop.key) + 1):
                self.prefixes.setdefault(prop.key[:end], []).append(j)
        n = len(props)
        self.last = [n - 1] * (n + 1)
        self.closable = [True] * (n + 1)
        for j in range(n - 1, -1, -1):
            self.last[j] = j if props[j].required else self.last[j + 1]
            self.closable[j] = self.closable[j + 1] and not props[j].required

    def may_follow(self, prefix: bytes, index: int, fits=None) -> bool:  # noqa: ANN001 - property index -> bool
        """Whether a property that may come next from ``index`` has a name starting with ``prefix``
        (and, given ``fits``, a value that fits where it would be written)."""
        js = self.prefixes.get(prefix)
        if not js:
            return False
        at = bisect.bisect_left(js, index)
        if fits is None:
            return at < len(js) and js[at] <= self.last[index]
        while at < len(js) and js[at] <= self.last[index]:
            if fits(js[at]):
                return True
            at += 1
        return False
