"""Shorthand written out, so that a question asked in short and the same asked in full read alike.

MiniLM scores "When did WW2 end?" / "What year did World War II end?" 0.87 and "sqrt of 144?" / "What
is the square root of 144?" 0.90, and the verifier's guards read "WW2" as a name the other side
lacks: a blind held-out set (``heldout11`` in bench/cache_pairs.jsonl) lost most of its refused
paraphrases to abbreviations and to a request's framing. Two readings:

    written_out(text)     abbreviations, symbols and run-together contractions written in full:
                          "USA" / "U.S." United States, "WW2" World War II, "sqrt" square root,
                          "oz" ounces, "15%" 15 percent, "100°F" 100 degrees Fahrenheit, "w/o"
                          without, "whats" what's, "dont" don't. Every guard reads it (through
                          ``spelling.normalised``) and so does the embedder.
    framed_off(text)      a request's framing taken off its start and end. Its neutral part
                          (``neutral=True``: a greeting, "Quick question:", "I was wondering",
                          "Do you know what ...", "thanks") the guards do without too; the favour
                          asked ("Could you tell me", "Can you explain", "please") only the
                          embedder, since the guards read it themselves (a favour is no modal,
                          cache/logic.py; "tell me" names no person, cache/persons.py).
    for_embedding(text)   what the semantic tier embeds: ``framed_off(written_out(text))``.

Only what has one reading is written out. Case decides where it must: "US" is the United States and
"us" is not; units are lower case, and written out only after a number or a word that asks for a
measure ("6 ft", "how many oz"; not "song ft Drake", "the wizard of oz", "yr dog"; "HR", "TSP", "LB"
are other things); a text in capitals only ("HELP US") keeps its capitals as they are; "JS", "TS"
and "ASAP" before a capitalised word may be a name ("JS Bach", "TS Eliot", "ASAP Rocky": as
written). Nothing inside backticks is touched, nor a word that is part of code ("math.sqrt(x)",
"my_dict", "Node.js", "--dict"). Short forms with another everyday meaning are left as written: "AI"
(also Adobe Illustrator), "ML" (a moneyline bet, millilitres), "hr" (heart rate), "min" (minimum
or minutes), "sec", "LA", "PM", "BC", "diff", "u", "repo" (the repo rate), "func", "docs" (Google
Docs), "info", "cant" (a word). Two QAs' pairs (``qa13``, ``qa14``) found most of these.

Typos are not mended: the embedder's vocabulary lacks many real words ("bellow", "sliver", "latte"),
which one swapped or doubled letter turns into others ("below", "silver", "late"), so a mend against
it served "What does bellow mean?" the answer to "What does below mean?" (found by a QA of the first
version).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

# After a number or a word that asks for a measure (fixed-width look-behinds, one each).
_MEASURE = "(?:" + "|".join(f"(?<={w} )" for w in (r"\d", r"\bmany", r"\bmuch", r"\bper", r"\bto", r"\binto",
                                                   r"\bin", r"\bconvert", r"\bConvert")) + ")"

# (short forms, long form, whether case must match). A short form is a regex fragment.
_FORMS: list[tuple[str, str, bool]] = [
    # places and bodies
    (r"U\.S\.A\.?|USA|U\.S\.(?=\s|$|[,;:?!)])|U\.S(?=\s)|US", "United States", True),
    (r"U\.K\.?|UK", "United Kingdom", True),
    (r"EU", "European Union", True),
    (r"UN", "United Nations", True),
    (r"UAE", "United Arab Emirates", True),
    (r"NYC", "New York City", False),
    # history
    (r"WW\s?(?:2|II)|World War 2|(?:the )?Second World War", "World War II", False),
    (r"WW\s?(?:1|I)|World War 1|(?:the )?First World War", "World War I", False),
    # computing
    (r"JS", "JavaScript", True),
    (r"TS", "TypeScript", True),
    (r"k8s", "Kubernetes", False),
    (r"sqrt", "square root", False),
    (r"dict", "dictionary", False),
    (r"dicts", "dictionaries", False),
    (r"env vars?", "environment variables", False),
    (r"regexp?", "regular expression", True),
    # measures, in lower case, after a number or a word that asks for a measure ("6 ft", "how many
    # oz", "per hr", "lbs to kg"; not "song ft Drake", "my hr", "yr dog", "an lb in nginx"). The
    # unit guard reads both forms as one unit; the embedder reads the long one better.
    *((_MEASURE + short, long, True) for short, long in (
        (r"oz", "ounces"), (r"lbs?", "pounds"), (r"kgs?", "kilograms"), (r"kms?", "kilometers"),
        (r"cm", "centimeters"), (r"mm", "millimeters"), (r"ml", "milliliters"), (r"ft", "feet"),
        (r"mph", "miles per hour"), (r"kph|km/h", "kilometers per hour"), (r"tbsps?", "tablespoons"),
        (r"tsps?", "teaspoons"), (r"hrs", "hours"), (r"mins", "minutes"), (r"secs", "seconds"),
        (r"yrs?", "years"))),
    # everyday shorthand
    (r"sci-?fi", "science fiction", False),
    (r"approx\.?", "approximately", False),
    (r"w/o", "without", False),
    (r"w/", "with", False),
    (r"b/c", "because", False),
    (r"pls|plz", "please", False),
    (r"thx|thnx", "thanks", False),
    (r"govt", "government", False),
    (r"dept", "department", False),
    (r"bday", "birthday", False),
    (r"asap", "as soon as possible", False),
    (r"btw", "by the way", False),
    (r"ppl", "people", False),
    (r"pics", "pictures", True),
]

# Contractions typed without their apostrophe (the negation guard reads "don't", not "dont"). Not
# read when a text's language is judged: "dont" is French too ("le livre dont je parle").
_NOT_OWNED = "".join(f"(?<!\\b{p} )" for p in ("his", "her", "their", "its", "our", "my", "your"))  # "his wont"
_AFTER_CANT = "|".join((
    "i", "you", "we", "he", "she", "it", "they", "my", "your", "our", "the", "this", "that", "these", "those",
    "find", "connect", "open", "load", "log", "login", "sign", "access", "install", "download", "upload", "print",
    "start", "boot", "charge", "turn", "work", "run", "see", "hear", "get", "send", "receive", "delete", "remove",
    "update", "sync", "play", "sleep", "stop", "remember", "save", "use", "pay", "change", "reset", "join", "eat",
    "breathe", "focus", "afford", "go", "be", "do", "have", "make", "let"))
_AFTER_PRONOUN = "(?:" + "|".join(f"(?<=\\b{p} )" for p in ("i", "you", "we", "he", "she", "it", "they")) + ")"
_CONTRACTIONS: list[tuple[str, str, bool]] = [
    (r"whats", "what's", False),
    (r"hows", "how's", False),
    (r"whos", "who's", False),
    (r"wheres", "where's", False),
    (r"thats", "that's", False),
    (r"theres", "there's", False),
    (r"dont", "don't", False),
    (r"doesnt", "doesn't", False),
    (r"didnt", "didn't", False),
    (r"isnt", "isn't", False),
    (r"arent", "aren't", False),
    (r"wasnt", "wasn't", False),
    (r"werent", "weren't", False),
    (r"couldnt", "couldn't", False),
    (r"shouldnt", "shouldn't", False),
    (r"wouldnt", "wouldn't", False),
    (r"havent", "haven't", False),
    (r"hasnt", "hasn't", False),
    (r"youre", "you're", False),
    # "cant" and "wont" are words too (hypocritical talk; a habit, "as is his wont"): only beside a
    # pronoun ("Why cant I", "it wont start"), or before a determiner or an everyday verb ("Why cant my
    # phone connect", "cant find my printer", "wont charge", "cant Windows find": a re-check QA's finds)
    (_NOT_OWNED + r"cant(?= (?:(?-i:[A-Z])|(?:" + _AFTER_CANT + r")\b))|" + _AFTER_PRONOUN + "cant", "can't", False),
    (_NOT_OWNED + r"wont(?= (?:(?-i:[A-Z])|(?:" + _AFTER_CANT + r")\b))|" + _AFTER_PRONOUN + "wont", "won't", False),
]

# A short form stands alone: not after a word character, a dot, a path, an option or a sigil, and not
# before a word character, a bracket or call, an assignment, or a dot, colon or hyphen that goes on
# into a word ("Node.js", "dict.items", "std::", "dict-like" stay as written; "repo." at a sentence's
# end is written out).
_BEFORE = r"(?<![\w.@#$/\\'’-])"
_AFTER = r"(?![\w(\[{=@#$/\\]|['’](?!s\b)|[.:\-/]\w)"


def _one(forms: list[tuple[str, str, bool]], case: bool) -> tuple[re.Pattern[str], dict[str, str]]:
    chosen = [(f, long) for f, long, cs in forms if cs == case]
    pattern = re.compile(_BEFORE + "(?=[A-Za-z])(?:" + "|".join(f"(?P<f{i}>{f})" for i, (f, _) in enumerate(chosen)) + ")" + _AFTER,
                         0 if case else re.I)
    return pattern, {f"f{i}": long for i, (_, long) in enumerate(chosen)}


_CASED, _CASED_LONG = _one(_FORMS, True)
_ANY_CASE, _ANY_CASE_LONG = _one(_FORMS, False)
_CONTRACTED, _CONTRACTED_LONG = _one(_CONTRACTIONS, False)
_PERCENT = re.compile(r"(?<=\d)%(?!\s*\d|[\w(%])")
# a temperature: a number with "°" or "degrees" before C or F; or a bare "400F" / "100 C" after a word
# that leads to a temperature ("bake at 400F", "is 100F"; not "Windows 10 C drive", "a 34C", "2015 F-150")
_TEMPERATURE_BEFORE = "(?:" + "|".join(f"(?<=\\b{w} )" for w in (
    "at", "to", "is", "in", "of", "from", "below", "above", "around", "about", "over", "under", "than", "reach",
    "reaches", "hit", "hits", "convert", "Convert", "be", "was", "set")) + ")"
_DEGREES = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?(?:°|degrees? ) ?([CF])\b"
                      r"|" + _TEMPERATURE_BEFORE + r"(\d+(?:\.\d+)?) ?([CF])(?![\w'’-])"
                      r"|(?<=\bdegrees )([CF])\b")
_CODE = re.compile(r"(`+)[^`]*?\1|```.*?```", re.S)


def _degrees(m: re.Match[str]) -> str:
    """"100°F", "100 degrees F", "at 400F": 100 (400) degrees Fahrenheit; "degrees C": degrees Celsius."""
    number, scale = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if m.group(5):
        return "Celsius" if m.group(5) == "C" else "Fahrenheit"
    return number + " degrees " + ("Celsius" if scale == "C" else "Fahrenheit")


_NAME_AFTER = re.compile(r" [A-Z]")
_INITIALS = frozenset(("JS", "TS", "ASAP"))  # also a person's initials or name: "JS Bach", "ASAP Rocky"


def _named(m: re.Match[str]) -> bool:
    """An initialism before a capitalised word that may be part of a name ("JS Bach", "TS Eliot")."""
    return m.group(0) in _INITIALS and _NAME_AFTER.match(m.string, m.end()) is not None


def _long(table: dict[str, str]) -> Callable[[re.Match[str]], str]:
    """A match's long form, capitalised where the short one was ("Sqrt": Square root)."""
    def long_form(m: re.Match[str]) -> str:
        long, short = table[m.lastgroup], m.group(0)
        if _named(m):
            return short
        return long[0].upper() + long[1:] if short[0].isupper() else long
    return long_form


_ANY_CASE_SUB, _CONTRACTED_SUB = _long(_ANY_CASE_LONG), _long(_CONTRACTED_LONG)


def _cased_sub(m: re.Match[str]) -> str:
    # (the long form as it is written: "United States", "JavaScript", "ounces")
    return m.group(0) if _named(m) else _CASED_LONG[m.lastgroup]


def _write(segment: str, shouting: bool, contractions: bool) -> str:
    if not shouting:
        segment = _CASED.sub(_cased_sub, segment)
    segment = _ANY_CASE.sub(_ANY_CASE_SUB, segment)
    if contractions:
        segment = _CONTRACTED.sub(_CONTRACTED_SUB, segment)
    if "%" in segment:
        segment = _PERCENT.sub(" percent", segment)
    if "C" in segment or "F" in segment:
        segment = _DEGREES.sub(_degrees, segment)
    return segment


@functools.lru_cache(maxsize=8192)
def written_out(text: str, contractions: bool = True) -> str:
    """``text`` with its shorthand written in full (the module's doc), code in backticks as it is."""
    letters = [ch for ch in text if ch.isalpha()]
    shouting = bool(letters) and not any(ch.islower() for ch in letters)
    if "`" not in text:
        return _write(text, shouting, contractions)
    out, at = [], 0
    for m in _CODE.finditer(text):
        out.append(_write(text[at:m.start()], shouting, contractions))
        out.append(m.group(0))
        at = m.end()
    out.append(_write(text[at:], shouting, contractions))
    return "".join(out)


# -- a request's framing -----------------------------------------------------------------------------
# At a text's start (repeatedly: "Hi! Quick question: could you tell me ...") and at its end. A
# favour's verb stays ("Could you explain X" is "explain X"); "tell me" before a question word goes
# with its framing ("Can you tell me how to ..." is "how to ..."). "Do you know how to swim?" and
# "Can you write in Chinese?" ask what the listener can do: they keep theirs. A greeting goes only
# before what opens a question or a request ("Hey Jude", "Good Morning, Vietnam", "Hello, world" are
# titles).
_WH = r"(?:how|what|why|when|where|which|who|whom|whose|whether|if|about)"
_NEUTRAL = (
    r"(?:(?:hi|hello|hey|greetings|good (?:morning|afternoon|evening))(?: there| all| everyone| guys)?\s*[,!.:;-]*\s*"
    r"(?=(?:how|what|why|when|where|which|who|can|could|would|will|is|are|do|does|did|should|i|i'm|my|"
    r"quick|question|please|tell|explain)\b))"
    r"|(?:a )?quick question\s*[,!.:;-]+|(?:i have a |one |simple |a )?question\s*[:,-]+"
    r"|i (?:was|am|'m) (?:just )?(?:wondering|curious)(?: (?:if|whether)(?: (?:you|anyone) (?:could|can|would)(?: please)?"
    r"(?= (?:explain|describe|recommend|suggest|list|give|tell|show)\b)|(?= (?:you|anyone) (?:could|can|would)\b)))?"
    r"|i(?:'d| would) like to know|i want to know|i need to know"
    r"|(?:do you|does anyone) know(?=\s+(?:what|why|when|where|which|who|whom|whose|whether|if)\b)"
    r"|any ?idea(?=\s+" + _WH + r"\b)")
_FAVOUR = (
    r"(?:please|kindly)\b\s*,?"
    r"|(?:can|could|would) you (?:please )?help me (?=understand\b)"
    r"|(?:can|could|would|will) you(?: please)?(?: kindly)?(?: (?:tell|show) me| help me(?: with)?)?(?=\s+" + _WH + r"\b)"
    r"|(?:can|could|would|will) you(?: please)?(?: kindly)?(?=\s+(?:explain|describe|recommend|suggest|list|give|show|"
    r"summarize|summarise|translate|define|outline|proofread|correct|check|compare|name|provide|calculate|convert)\b)"
    r"|(?:you|anyone) (?:could|can|would)(?: please)? (?:tell|show) me(?=\s+" + _WH + r"\b)"
    r"|tell me(?=\s+" + _WH + r"\b)"
    r"|(?:can|could|would|will) you(?: please)? tell me(?=\s+the\b)")
_OPENING_NEUTRAL = re.compile(r"^\s*(?:" + _NEUTRAL + r")\s*", re.I)
_OPENING = re.compile(r"^\s*(?:" + _NEUTRAL + "|" + _FAVOUR + r")\s*", re.I)
# thanks or please after a sentence mark ("How do I exit vim? Thanks!"; not after a comma, where it
# may be a list's last item: "Translate: hello, goodbye, thank you")
_CLOSING = re.compile(r"(?<=[.!?])(?:\s*\b(?:please|thanks(?: (?:a lot|so much|in advance))?|"
                      r"thank you(?: (?:so much|very much|in advance))?|thx|cheers|ty)\b[\s.!]*)+$", re.I)
_UNDERSTAND = re.compile(r"^understand\b", re.I)


@functools.lru_cache(maxsize=8192)
def framed_off(text: str, neutral: bool = False) -> str:
    """``text`` without a request's framing at its start or end (``neutral``: only the part that
    names no favour, which the guards do without); itself if nothing were left."""
    opening = _OPENING_NEUTRAL if neutral else _OPENING
    body = text
    for _ in range(4):
        m = opening.match(body)
        if not m or not m.end():
            break
        body = body[m.end():]
    if not neutral:
        body = _UNDERSTAND.sub("explain", body)
    body = _CLOSING.sub("", body).rstrip(" ,;")
    if body is text or not any(ch.isalnum() for ch in body):
        return text
    body = body.strip()
    return body[0].upper() + body[1:] if text.lstrip()[:1].isupper() else body


def for_embedding(text: str) -> str:
    """What the semantic tier embeds for ``text``: written out, framing off."""
    return framed_off(written_out(text))
