"""The person guard of the hard-negative verifier (cache/verifier.py): whose question it is.

MiniLM scores "What is my / your IP address?" 0.96, "Can you / I see my earlier messages?" 0.97,
"Can you call me / Can I call you by a nickname?" 0.97 and "I owe my friend money / My friend owes
me money" 0.95: the pronouns that say who does what, and whose thing it is, weigh next to nothing.
Yet English rewords a question between persons all the time without changing it: "How do I / you
reset my / your router?" (the generic "you"), "How can we / I save money on groceries?".

So each text's first- and second-person words, after a favour's framing ("Can you tell me …",
"Show me …"), are read with their role (``persons``): subject (I,
we, a "you" after an auxiliary or at a clause's start, "for me to"), object (me, us, another
"you"), owner (my, our, your) and whether the person is described ("am I", "are you", "you're").
Two texts are apart (``persons_apart``) when:

- one is framed as a favour asked of the listener ("Will you teach me …?") and the other names the
  listener as an object ("Will I teach you …?");
- one of them names both persons, or is framed as a favour (so its "you" is the listener, not
  anyone: "Can you see my messages?"), and a role that both give a person gives it another one ("Can I see my
  messages?"; "Can I call you …?" against "Can you call me …?"; "your last answer" against "my
  last message");
- else, the owners named differ while the subjects are the same ("What is my / your IP
  address?"; "How do I reset my password?" / "How do you reset your password?" moves both and
  passes), or the person described differs ("What time zone are you in? / am I in?"), or the
  speaker is the subject on one side only and the object on the other side only ("I owe my friend
  money" / "My friend owes me money").

Role swaps inside a clause with a third person ("Should I tip my hairdresser if she / I own(s) the
salon?") are left to the other guards; a blind held-out set of such pairs (``heldout9``) measures
what is still served.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[.?!;:,]")

_SUBJECT_1 = frozenset("i i'm i've i'd i'll we we're we've we'd we'll".split())
_OBJECT_1 = frozenset("me us".split())
_OWNER_1 = frozenset("my mine our ours".split())
_SUBJECT_2 = frozenset("you're you've you'd you'll".split())
_OWNER_2 = frozenset("your yours".split())
_DESCRIBED = frozenset("i'm we're you're".split())
_BE = frozenset("am are was were".split())
# after these (or at a clause's start) "you" is a subject: "Can you …", "What do you do if you …"
_BEFORE_SUBJECT = frozenset("""can could do does did will would should shall may might must are were have has
    had if when whenever that and but or because so who what where why how whether while before after
    once unless until than for""".split())
_BREAKS = frozenset(".?!;:,")
_CAUSATIVE = frozenset("make makes made making let lets help helps helped cause causes caused get gets".split())
# a favour asked is the request's framing, not a person in the question: "Can you tell me how to
# reset my password?" asks "How do I reset my password?"
_FAVOUR = re.compile(r"^\W*(?:please\s+)?(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
                     r"(?:tell|show|explain|teach|help|remind|give)\s+(?:to\s+)?me\b")


@dataclass(slots=True, frozen=True)
class Persons:
    """Who a text names in which role: 1 the speaker (I, we), 2 the listener (you)."""

    subject: frozenset[int] = frozenset()
    object: frozenset[int] = frozenset()
    owner: frozenset[int] = frozenset()
    described: frozenset[int] = frozenset()
    favour: bool = False  # framed as a favour asked ("Can you tell me …"), the framing's persons left out

    @property
    def both(self) -> bool:
        """It names the speaker and the listener (a favour's framing names both), so its "you" is
        the listener, not anyone."""
        named = self.subject | self.object | self.owner | self.described
        return self.favour or (1 in named and 2 in named)


def persons(text: str) -> Persons:
    """The first- and second-person words of ``text`` (already normalised: lower case works)."""
    text, favours = _FAVOUR.subn("", text.lower().replace("’", "'"))
    words = _WORD.findall(text)
    subject: set[int] = set()
    obj: set[int] = set()
    owner: set[int] = set()
    described: set[int] = set()
    for i, w in enumerate(words):
        before = words[i - 1] if i else "."
        after = words[i + 1] if i + 1 < len(words) else "."
        if w in _SUBJECT_1:
            subject.add(1)
            if w in _DESCRIBED or before in _BE or after in _BE:
                described.add(1)
        elif w in _OBJECT_1:
            # "for me to decline" and "what makes me tired" name the one who declines, who is tired
            (subject if (before == "for" and after == "to") or before in _CAUSATIVE else obj).add(1)
        elif w in _OWNER_1:
            owner.add(1)
        elif w in _SUBJECT_2:
            subject.add(2)
            if w in _DESCRIBED:
                described.add(2)
        elif w == "you":
            if before in _BREAKS or before in _BEFORE_SUBJECT:
                subject.add(2)
                if before in _BE or after in _BE:
                    described.add(2)
            else:
                obj.add(2)
        elif w in _OWNER_2:
            owner.add(2)
    return Persons(frozenset(subject), frozenset(obj), frozenset(owner), frozenset(described), bool(favours))


def _differ(a: frozenset[int], b: frozenset[int]) -> bool:
    return bool(a) and bool(b) and a != b


def persons_apart(a: Persons, b: Persons) -> bool:
    """Whether ``a`` and ``b`` ask about other persons (the module docstring says when)."""
    for framed, other in ((a, b), (b, a)):
        # a favour asked of the listener against a text where the speaker does it for the listener
        # ("Will you teach me …?" / "Will I teach you …?", "explain to me / to you": found by a review)
        if framed.favour and not other.favour and 2 in other.object - framed.object:
            return True
    if a.both or b.both:
        return _differ(a.subject, b.subject) or _differ(a.object, b.object) or _differ(a.owner, b.owner)
    if _differ(a.owner, b.owner) and a.subject == b.subject:
        return True
    if _differ(a.described, b.described):
        return True
    return bool((1 in a.subject - b.subject and 1 in b.object - a.object)
                or (1 in b.subject - a.subject and 1 in a.object - b.object))
