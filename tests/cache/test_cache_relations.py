"""Ordered relations: what the relation guard reads from a question's word order."""

import pytest

from cache.relations import Relation, reversed_relation
from cache.verifier import Verifier, stem


@pytest.fixture(scope="module")
def verifier():
    return Verifier()  # relations need no vocabulary


def rel(kind: str, src: set[str], dst: set[str]) -> Relation:
    return Relation(kind, frozenset(map(stem, src)), frozenset(map(stem, dst)))


@pytest.mark.parametrize("text,expected", [
    ("Convert USD to EUR.", rel("to", {"convert", "usd"}, {"eur"})),
    ("Translate it from English to French.", rel("to", {"english"}, {"french"})),
    ("Move files to my laptop from my phone.", rel("to", {"phone"}, {"laptop"})),
    ("Is a dog bigger than a cat?", rel("than", {"dog", "bigger"}, {"cat"})),
    ("Is Paris north of London?", rel("north of", {"paris"}, {"london"})),
    ("Does the moon orbit the earth?", rel("verb:orbit", {"moon"}, {"earth"})),
    ("Is YouTube owned by Google?", rel("verb:own", {"google"}, {"youtube"})),
    ("How far is Paris from London?", rel("from", {"london"}, {"far", "paris"})),
    # "in" between two units converts: "ounces in a pound" and "a pound in ounces" both go lb -> oz
    ("How many ounces in a pound?", rel("to", {"lb"}, {"oz"})),
    ("How many ounces are there in a pound?", rel("to", {"lb"}, {"oz"})),
    ("What is a pound in ounces?", rel("to", {"lb"}, {"oz"})),
    ("How many pounds in an ounce?", rel("to", {"oz"}, {"lb"})),
    ("What is 100 Fahrenheit in Celsius?", rel("to", {"fahrenheit"}, {"celsius"})),
])
def test_relations_found(verifier, text, expected):
    assert expected in verifier.analyse(text).relations


@pytest.mark.parametrize("text", [
    "How to reset my password?",  # an infinitive: nothing before "to"
    "What is the best way to learn Rust?",  # the same after stopwords and filler
    "Compare Python and Java.",  # names joined by a symmetric word
    "What is the capital of France?",
    "How many calories are in an egg?",  # "in" relates units only
    "How do I sort a list in Python?",
])
def test_no_relation(verifier, text):
    assert verifier.analyse(text).relations == frozenset()


def test_clauses_bound_the_sides(verifier):
    rels = verifier.analyse("In Python, convert a string to an int").relations
    assert rels == {rel("to", {"convert", "string"}, {"int"})}  # "python" is in another clause


def test_reversed_needs_words_moving_both_ways():
    a = rel("to", {"celsius"}, {"fahrenheit"})
    assert reversed_relation(frozenset({a}), frozenset({rel("to", {"fahrenheit"}, {"celsius"})}))
    assert not reversed_relation(frozenset({a}), frozenset({rel("than", {"fahrenheit"}, {"celsius"})}))
    assert not reversed_relation(frozenset({a}), frozenset({rel("to", {"fahrenheit"}, {"kelvin"})}))
    assert not reversed_relation(frozenset({a}), frozenset({rel("to", {"celsius", "fahrenheit"}, {"celsius"})}))
