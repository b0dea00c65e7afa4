"""The language the hard-negative verifier reads (cache/verifier.py): English, in Latin letters.

Its word lists are English, and MiniLM learnt English: in another language neither sees the word
that changes what a question asks. "De ce se încarcă laptopul meu?" / "De ce nu se încarcă …?"
(Romanian: why is / isn't my laptop charging) embed at 0.977, "Hoe zet ik wifi aan / uit?" (Dutch:
turn wifi on / off) at 0.946, and no guard knows "nu", "aan" or "uit". ``reads`` says whether a
text is English enough for the guards; the cache gives any other text no semantic tier:

    script    every letter is in the Latin script (accents are Latin); and
    English   a text of two words or more has an English function word (``FUNCTION_WORDS``, or
              the pronoun "I"), or two thirds of its words of two letters or more are English
              words: whole words of MiniLM's vocabulary (or one inflected: -s, -ed, -ing) or of
              the verifier's own lists (delete, celsius, kubernetes), so that keyword queries
              ("python sort list by key", "kubernetes restart pod") and imperatives ("Explain
              quantum physics simply.") are read too. No function word is also a common word of
              another language ("a", "is", "in", "to" are not), and one-letter words do not count.

Other Latin-script languages mostly fail both (a few sentences pass, made of short words MiniLM's
vocabulary holds: "Waar is het station?"), and English that quotes one mostly passes ("What does
'Je ne suis pas fatigué' mean?", "Translate to English: Ich bin nicht müde."): the verifier's
negation words of other languages read such quotes.

``folded`` writes Latin letters typed as others as the letters they stand for, before any guard
reads a text: the dotless ı and dotted İ of Turkish keyboards ("How do I dısable 2FA?" was served
the cached "enable 2FA" answer at 0.927: the verifier read "dısable" as a word of its own),
ligatures (ﬁ, ﬂ, ﬀ from PDFs), the long s (ſ), full-width and mathematical letters (ｄ, 𝐝).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping

from cache import lexicon as lx

_LETTERS = re.compile(r"[^\W\d_]+")  # runs of letters: "two-factor", "don't" and "2FA" are read in parts
# Every English word of the verifier's lists (multi-word entries in parts; no other language's).
_LEXICON = frozenset(w for words in (
    lx.STOPWORDS, lx.FILLER, lx.NEGATIONS - lx.NEGATIONS_ABROAD, lx.NEGATING_VERBS, lx.GRADABLE,
    lx.NUMBER_WORDS, lx.ORDINALS, lx.MONTHS, lx.WEEKDAYS, lx.UNIT_OF, lx.TASK_OF, lx.ENTITY_WORDS,
    (w for pair in lx.ANTONYM_PAIRS for side in pair for w in side.split()),
    (w for members in lx.CONTRAST_CLASSES for w in re.split(r"[\s/]+", members)),
) for w in words if w.isalpha())
_DOTLESS = str.maketrans({"ı": "i", "İ": "I"})


def reads(text: str, vocab: Mapping[str, int]) -> bool:
    """Whether the verifier can read ``text``: Latin letters, and English enough (module docstring).
    ``vocab``: MiniLM's word-piece vocabulary (without one, only the verifier's lists count)."""
    if not text.isascii():
        text = folded(unicodedata.normalize("NFC", text))
        if not all(is_latin(ch) for ch in text if ch.isalpha()):
            return False
    words = _LETTERS.findall(text)
    if len(words) < 2 or any(w == "I" or w.lower() in lx.FUNCTION_WORDS for w in words):
        return True
    words = [w.lower() for w in words if len(w) > 1]
    english = sum(w in _LEXICON or any(f in vocab for f in inflections(w)) for w in words)
    return 3 * english >= 2 * len(words) > 0  # two thirds


def inflections(w: str) -> tuple[str, ...]:
    """``w`` and the words English inflection may have made it from (-s, -ed, -ing, a dropped -e)."""
    return (w, w.rstrip("s"), w + "e", w[:-2] if w.endswith("ed") else w, w[:-3] if w.endswith("ing") else w)


def folded(text: str) -> str:
    """``text`` with the Latin letters typed as others written as the letters they stand for (ı,
    ligatures, ſ, full-width and mathematical letters: module docstring)."""
    if text.isascii():
        return text
    return "".join(_letters_of(ch) if ord(ch) > 127 else ch for ch in text.translate(_DOTLESS))


@functools.lru_cache(maxsize=4096)
def _letters_of(ch: str) -> str:
    """A cased letter's compatibility form where that is Latin letters ("ﬁ" -> "fi", "ſ" -> "s",
    "ｄ" -> "d", "ℓ" -> "l"); else ``ch`` (accents stay: "é" is a letter of its own; "µ" is Greek)."""
    if unicodedata.category(ch) not in ("Ll", "Lu", "Lt"):
        return ch
    form = unicodedata.normalize("NFKC", ch)
    return form if form != ch and form.isalpha() and all(is_latin(c) for c in form) else ch


@functools.lru_cache(maxsize=4096)
def is_latin(ch: str) -> bool:  # (a compatibility form of a Latin letter too: the ordinal "ª" is an "a")
    return "LATIN" in unicodedata.name(ch, "") or unicodedata.normalize("NFKD", ch).isascii()
