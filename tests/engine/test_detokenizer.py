import pytest

from engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def byte_tokenizer(tiny_model_dir):
    """A real Hugging Face byte-level tokenizer where every UTF-8 byte is its own token, so
    multi-byte characters always span several tokens."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def feed(detok, ids, finish=True):
    deltas, stopped_at = [], None
    for i, t in enumerate(ids):
        if detok.add_token(t):
            stopped_at = i
            deltas.append(detok.take_delta(True))
            break
        deltas.append(detok.take_delta(False))
    else:
        if finish:
            deltas.append(detok.take_delta(True))
    return deltas, stopped_at


def test_multibyte_utf8_never_split(byte_tokenizer):
    text = "héllo 世界 🎉 ok"
    ids = byte_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode())  # one token per byte
    detok = IncrementalDetokenizer(byte_tokenizer, byte_tokenizer.encode("Q: ", add_special_tokens=False), [])
    deltas, _ = feed(detok, ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    # the 4 bytes of the emoji come out as one delta, at its last byte
    assert "🎉" in deltas


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_prompt_that_ends_partway_through_a_character_has_it_completed_in_the_output(byte_tokenizer, cut):
    """Found by QA: a token-id prompt ending in the first bytes of an emoji, completed by the output's
    first token: the emoji was in neither text (its bytes only in ``logprobs``)."""
    ids = byte_tokenizer.encode("emoji: 🔥🐍🔥", add_special_tokens=False)
    split = len(ids) - 8 + cut  # the prompt holds the first `cut` of the 🐍's four bytes
    detok = IncrementalDetokenizer(byte_tokenizer, ids[:split], [])
    deltas, _ = feed(detok, ids[split:])
    assert "".join(deltas) == "🐍🔥"
    # the answer cut before it completes the character: a U+FFFD for the bytes it has (a re-check
    # found "": the README's promise is U+FFFD for that part)
    if cut < 3:
        detok = IncrementalDetokenizer(byte_tokenizer, ids[:split], [])
        assert "".join(feed(detok, ids[split : split + 1])[0]) == "\ufffd"
    # a U+FFFD that is the prompt's own text is not repeated in the answer
    detok = IncrementalDetokenizer(byte_tokenizer, byte_tokenizer.encode("odd \ufffd", add_special_tokens=False), [])
    assert "".join(feed(detok, byte_tokenizer.encode(" ok", add_special_tokens=False))[0]) == " ok"


def test_stop_string_across_tokens_is_never_emitted(byte_tokenizer):
    ids = byte_tokenizer.encode("Hello STOP world", add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_tokenizer, [], ["STOP"])
    deltas, stopped_at = feed(detok, ids)
    assert stopped_at == len("Hello STOP") - 1
    assert "".join(deltas) == "Hello "
    assert detok.text == "Hello "


def test_possible_stop_prefix_is_held_back_then_released(byte_tokenizer):
    detok = IncrementalDetokenizer(byte_tokenizer, [], ["STOP", "\n\n"])
    emitted = ""
    for ch in "ab ST":
        assert not detok.add_token(byte_tokenizer.encode(ch, add_special_tokens=False)[0])
        emitted += detok.take_delta(False)
    assert emitted == "ab "  # "ST" could start "STOP"
    detok.add_token(byte_tokenizer.encode("x", add_special_tokens=False)[0])
    emitted += detok.take_delta(False)
    assert emitted == "ab STx"
    detok.add_token(byte_tokenizer.encode("\n", add_special_tokens=False)[0])
    assert detok.take_delta(False) == ""
    assert detok.take_delta(True) == "\n"  # finishing releases what was held back


def test_multibyte_stop_string(byte_tokenizer):
    ids = byte_tokenizer.encode("abc世界def", add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_tokenizer, [], ["界"])
    deltas, stopped_at = feed(detok, ids)
    assert "".join(deltas) == "abc世" and stopped_at is not None


def test_special_tokens_are_not_text(byte_tokenizer):
    ids = byte_tokenizer.encode("hi", add_special_tokens=False) + [byte_tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(byte_tokenizer, [], [])
    deltas, _ = feed(detok, ids)
    assert "".join(deltas) == "hi"


def test_without_tokenizer_text_is_empty():
    detok = IncrementalDetokenizer(None, [1, 2], ["x"])
    assert not detok.add_token(5)
    assert detok.take_delta(True) == ""


class _CountingStop(str):
    """A stop string that counts the prefixes taken of it (the held-back search's work)."""

    taken = 0

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        type(self).taken += 1
        return str.__getitem__(self, key)


def test_the_held_back_search_reads_only_unreleased_text() -> None:
    """Found by QA: 16 stop strings of 100,000 characters were matched against the whole answer on
    every token (0.2-0.46 s a step at 32,000 characters, on the engine's thread). Text already
    released cannot be held back: only the unreleased end is searched, whatever the stops' length."""
    stop = _CountingStop("Q" * 100_000)
    d = IncrementalDetokenizer(None, [], [stop] * 16)
    released = ""
    for _ in range(2000):  # 16,000 characters, a few a token
        d.text += "abcdefg "
        released += d.take_delta(False)
    assert released == d.text
    assert _CountingStop.taken <= 16 * 2000 * 8  # at most the new characters a token, per stop
    _CountingStop.taken = 0
    d.text += "QQQ"  # the start of a stop: held back, then released with what breaks it
    assert d.take_delta(False) == "" and d.take_delta(False) == ""
    d.text += "x"
    assert d.take_delta(False) == "QQQx"


def test_a_stop_string_let_pass_before_min_tokens_is_not_found_later(byte_tokenizer):
    """Found by QA: with a longer stop string beside it, a short one let pass before ``min_tokens``
    was found again by the next token's search, which reached back the longest stop's length: the
    answer was cut there, with the stop string already released in it."""
    ids = byte_tokenizer.encode("in the heart of the city", add_special_tokens=False)
    min_tokens = len("in the heart") + 1  # " heart" completes before min_tokens
    for stops in ([" heart"], [" heart", "a much longer stop string"]):
        detok = IncrementalDetokenizer(byte_tokenizer, [], stops)
        text, stopped = "", False
        for i, t in enumerate(ids):
            if detok.add_token(t, check_stop=i + 1 >= min_tokens):
                stopped = True
                text += detok.take_delta(True)
                break
            text += detok.take_delta(False)
        else:
            text += detok.take_delta(True)
        assert (stopped, text) == (False, "in the heart of the city"), stops
    # a stop string that ends in the new text still counts, across the min_tokens boundary too
    detok = IncrementalDetokenizer(byte_tokenizer, [], ["rt of", "a much longer stop string"])
    stopped_at = next(i for i, t in enumerate(ids) if detok.add_token(t, check_stop=i + 1 >= min_tokens))
    assert stopped_at == len("in the heart of") - 1 and detok.text == "in the hea"
