"""Shorthand written out (cache/shorthand.py): what the guards and the embedder read, the framing
taken off, and the semantic tier serving a question asked in short (and not what merely looks so:
a QA's finds against the first version)."""

import pytest
from cache_testlib import answer, chat

from cache.api import CachePolicy
from cache.shorthand import for_embedding, framed_off, written_out
from cache.verifier import Verifier


@pytest.mark.parametrize("text, out", [
    ("When did WW2 end?", "When did World War II end?"),
    ("Who was the USA's first president?", "Who was the United States's first president?"),
    ("Do I need a visa as a US citizen?", "Do I need a visa as a United States citizen?"),
    ("sqrt of 144?", "square root of 144?"),
    ("how many oz in a pound", "how many ounces in a pound"),
    ("What is 15% of 80?", "What is 15 percent of 80?"),
    ("What is 100°F in Celsius?", "What is 100 degrees Fahrenheit in Celsius?"),
    ("bake at 400F", "bake at 400 degrees Fahrenheit"),
    ("in degrees C", "in degrees Celsius"),
    ("python: sort dict by its values", "python: sort dictionary by its values"),
    ("Recommend sci-fi books w/o spoilers", "Recommend science fiction books without spoilers"),
    ("Whats the point? I dont know", "What's the point? I don't know"),
    ("Dont worry, what is a dict?", "Don't worry, what is a dictionary?"),
    ("US Constitution", "United States Constitution"),
    ("Why cant I sleep?", "Why can't I sleep?"),  # beside a pronoun only (a QA's find)
    ("it wont start", "it won't start"),
    ("Why wont my laptop turn on?", "Why won't my laptop turn on?"),
    ("Why cant Windows find my printer?", "Why can't Windows find my printer?"),  # (a re-check QA's finds)
    ("My phone wont charge", "My phone won't charge"),
])
def test_shorthand_is_written_out(text, out):
    assert written_out(text) == out


@pytest.mark.parametrize("text", [
    "Can you help us?",  # "us" is no country
    "HELP US PLEASE",  # capitals only: "US" is the word
    "print(math.sqrt(2))", "my_dict.items()", "Node.js on a Mac", "x = 10 % 3", "a = 10%3",
    "`dict(a=1)` or {}", "use --dict here", "0x1F is 31", "Vitamin C", "Jony Ive", "Is the min 5?",
    # (a QA's finds: names, other acronyms, shouted units)
    "Who was JS Bach?", "Poems by TS Eliot", "The Wizard of Oz", "Who is ASAP Rocky?", "Ft. Lauderdale beaches",
    "How do I contact HR?", "Program a PIC", "AWS LB setup", "Give 5 ML of cough syrup", "Google Docs tips",
    "What is the repo rate?", "func main() {}",
    # (a second QA's finds: other meanings of AI, ML, hr, ft, yr, lb, cant; dates and sizes read as temperatures)
    "How do I vectorize an image in AI?", "How do I bet ML on an NFL game?", "Should I report my manager to hr?",
    "song ft Drake", "yr dog", "an lb in nginx", "wizard of oz", "What does cant mean?", "Windows 10 C drive",
    "2015 F-150", "Is a 34C bra big?", "the 4 C's of diamonds", "as is his wont", "political cant and hypocrisy",
    "as was his wont this morning",
])
def test_code_names_and_other_meanings_are_left_as_written(text):
    assert written_out(text) == text


def test_language_is_judged_on_contractions_as_typed(embedder):
    v = Verifier(vocab=embedder.vocab())
    assert v.reads("sqrt of 144?") and not v.reads("Pse laptopi im nuk karikohet?")
    assert written_out("le livre dont je parle", contractions=False) == "le livre dont je parle"


def test_units_are_written_out_where_a_measure_is_asked():
    assert written_out("5 ml of water") == "5 milliliters of water"
    assert written_out("how many oz in a pound") == "how many ounces in a pound"
    assert written_out("lbs to kg") == "lbs to kilograms"
    assert written_out("best ml course") == "best ml course"


@pytest.mark.parametrize("text, out", [
    ("Hey, quick question: could you tell me how to enable dark mode?", "How to enable dark mode?"),
    ("Can you recommend some good sci-fi books?", "Recommend some good science fiction books?"),
    ("I was wondering if you could tell me what the capital of France is", "What the capital of France is"),
    ("Can you help me understand recursion?", "Explain recursion?"),
    ("Please proofread: 'x'", "Proofread: 'x'"),
    ("How do I exit vim? Thanks!", "How do I exit vim?"),
    ("Can you tell me the capital of Australia?", "The capital of Australia?"),
    ("Explain recursion, please", "Explain recursion, please"),  # (after a comma: perhaps a list's last item)
    ("Translate: hello, goodbye, thank you", "Translate: hello, goodbye, thank you"),
    ("Good Morning, Vietnam: is it a true story?", "Good Morning, Vietnam: is it a true story?"),
    ("Hello, world program in C", "Hello, world program in C"),
    ("Thanks", "Thanks"), ("Please", "Please"),  # nothing left: as written
    ("Can you learn guitar at 40?", "Can you learn guitar at 40?"),  # whether one can: no favour
    # (a QA's finds: what the listener can do, names, words the framing shares)
    ("Do you know how to swim?", "Do you know how to swim?"), ("Can you write in Chinese?", "Can you write in Chinese?"),
    ("Hey Jude lyrics", "Hey Jude lyrics"), ("Hello Kitty merchandise", "Hello Kitty merchandise"),
    ("Any ideas for a birthday gift?", "Any ideas for a birthday gift?"),
    ("How do you say thank you?", "How do you say thank you?"),
    ("Do you know what time it is in Tokyo?", "What time it is in Tokyo?"),
])
def test_framing_comes_off_for_the_embedder(text, out):
    assert for_embedding(text) == out


def test_the_guards_do_without_the_neutral_framing_only():
    assert framed_off("Can I eat sushi?", neutral=True) == "Can I eat sushi?"
    assert framed_off("Hi, could you tell me how to exit vim?", neutral=True) == "Could you tell me how to exit vim?"
    assert framed_off("Hey, quick question: how long should I boil an egg?", neutral=True) == (
        "How long should I boil an egg?")


@pytest.mark.parametrize("cached, asked", [
    ("How many ounces are in a pound?", "how many oz in a pound"),
    ("Who was the first president of the United States?", "Who was the USA's first president?"),
    ("How do I convert a string to an integer in JavaScript?", "In JavaScript, how can I turn a string into an integer?"),
    ("Fix the grammar in this sentence: 'He don't like apples.'", "Please correct the grammar: 'He don't like apples.'"),
    ("Translate 'thank you very much' into Spanish", "How do I say 'thank you very much' in Spanish?"),
    ("What is the largest ocean on Earth?", "Which ocean is the biggest in the world?"),
    ("How many teaspoons in a tablespoon?", "How many teaspoons make up one tablespoon?"),
    ("Please proofread: 'Their going to the store tomorow.'", "Can you proofread this: 'Their going to the store tomorow.'"),
    ("What's the difference between a virus and bacteria?", "How are viruses different from bacteria?"),
    ("How long should I boil an egg?", "Hey, quick question: how long should I boil an egg?"),
    # (a QA's finds: qa13, qa14)
    ("Why can't I sleep at night?", "Why cant I sleep at night?"),
    ("What is the latest version of Python?", "What is the most recent version of Python?"),
    ("What is the newest iPhone?", "What is the latest iPhone?"),
    ("How many calories in a cup of rice?", "How many calories in one cup of rice?"),
])
def test_the_guards_pass_a_question_asked_in_short(cached, asked):
    assert Verifier().check(asked, cached).ok


@pytest.mark.parametrize("cached, asked", [
    ("Who was the first president of the United States?", "Who was the UK's first prime minister?"),
    ("What year did World War II end?", "When did WW1 end?"),
    ("How many teaspoons make up one tablespoon?", "How many teaspoons make up two tablespoons?"),
    ("Do I need a visa to visit Japan as a US citizen?", "As a Canadian citizen, do I need a visa to travel to Japan?"),
    ("What is the largest ocean on Earth?", "What is the largest ocean on Mars?"),
    ("How do I say 'thank you' in Spanish?", "How do I say 'thank you' in French?"),
    ("How do I undo the last git commit?", "How do I undo the first git commit?"),
    ("How many oz in a pound?", "How many oz in a kilogram?"),
    ("What is 15% of 80?", "What is 15% of 800?"),
    ("Can you help us?", "Can you help the US?"),
    # (a QA's finds against the first version)
    ("On a student visa, how many hours can I work?", "On a student visa, how many hours must I work?"),
    ("After surgery, how soon can I drive?", "After surgery, how soon must I drive?"),
    ("Can I take ibuprofen while pregnant, how often?", "Should I take ibuprofen while pregnant, how often?"),
    ("What did de Gaulle say in French about Quebec?", "Translate what de Gaulle said about Quebec into French."),
    ("How heavy is twenty one pounds in kilograms?", "How heavy is twenty pounds in kilograms?"),
    ("Who founded United Airlines?", "Who founded American Airlines?"),
    # (a second QA's finds against the second version)
    ("Is Canada part of America?", "Is Canada part of the United States?"),
    ("Is Northern Ireland part of Britain?", "Is Northern Ireland part of the UK?"),
    ("Which Mac is the fastest?", "Which macOS is the fastest?"),
    ("What is the latest chapter of One Piece?", "What is the last chapter of One Piece?"),
    ("In chess, how can a pawn move?", "In chess, how should a pawn move?"),
    ("As a Christian, how should I vote?", "As a Christian, how can I vote?"),
    ("What does cant mean?", "What does can't mean?"),
    ("Good Morning, Vietnam: is it a true story?", "Vietnam: is it a true story?"),
    ("What is the latest version of Python?", "What is the oldest version of Python?"),
    ("How do I undo my most recent commit?", "How do I undo my recent commits?"),  # (a review's finds)
    ("How do I install the newest version of Python?", "How do I install a recent version of Python?"),
    ("How many calories in one cup of rice?", "How many calories in two cups of rice?"),
])
def test_the_guards_still_refuse_what_shorthand_changes(cached, asked):
    assert not Verifier().check(asked, cached).ok


@pytest.mark.parametrize("cached, asked, other", [
    ("What is the square root of 144?", "sqrt of 144?", "sqrt of 169?"),
    ("What year did World War II end?", "When did WW2 end?", "When did WW1 end?"),
    ("Can you recommend some good sci-fi books?", "Recommend me a few good science fiction books",
     "Recommend me a few good romance books"),
    ("What is the population of NYC?", "Hey, quick question: what's the population of New York City? Thanks!",
     "Hey, quick question: what's the population of Mexico City? Thanks!"),
])
async def test_the_semantic_tier_serves_shorthand_framing_and_typos(make_cache, cached, asked, other):
    """Through SemanticCache and Redis at the default threshold (0.90): each was a miss embedded and
    guarded as typed."""
    policy = CachePolicy()
    assert policy.threshold == 0.90
    c = make_cache()
    await c.store("acme", chat(cached), answer("stored"), policy)
    hit = await c.lookup("acme", chat(asked), policy)
    assert hit.outcome == "semantic-hit", (asked, hit)
    assert hit.response["choices"][0]["message"]["content"] == "stored"
    miss = await c.lookup("acme", chat(other), policy)
    assert miss.outcome == "miss", miss
