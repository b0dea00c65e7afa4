"""The model's tokenizer (Hugging Face, from the model directory) and chat rendering."""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer, or None when it has no tokenizer files (token-id-only use)."""
    model_dir = Path(model_dir)
    if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _text_of(content) -> str:
    """OpenAI message content: a string, or a list of parts of which the text ones count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type", "text") == "text":
            parts.append(str(part.get("text", "")))
        elif isinstance(part, str):
            parts.append(part)
        else:
            raise ValueError("only text content parts are supported")
    return "".join(parts)


LONG_TEXT_CHARS = 8_000  # longer texts are encoded with the GIL released (see ChatRenderer.encode)
_MARK = "\ue000{}\ue001"  # a message's index between two private-use characters
_MARKS = re.compile("\ue000(\\d+)\ue001")


class ChatRenderer:
    """Token ids of chat messages under the tokenizer's chat template, and of plain text.

    The template is rendered to text and encoded with the Rust tokenizer: the same ids as
    transformers' ``apply_chat_template(tokenize=True)``, with ~30% less Python per request. A
    message whose content holds the text of a special token (``<|im_start|>``, ``<|im_end|>``, ...)
    does not get to open or close turns with it: then each content is encoded as plain text
    (special tokens spelled out) between the template's own pieces, which keep theirs. Texts
    longer than ``LONG_TEXT_CHARS`` go through ``encode_batch``, which releases the GIL (``encode``
    holds it: a 2.6M-character prompt froze every other request for ~2 s)."""

    def __init__(self, tokenizer) -> None:  # noqa: ANN001 - a transformers tokenizer
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self._plain = None  # the backend that spells special tokens out (made on first need)
        self._specials = None
        self._pieces = PieceCache.for_backend(self.backend) if self.backend is not None else None
        self._template = ChatTemplate.for_tokenizer(tokenizer)
        self._token_bytes: TokenBytes | None = None
        if self.backend is not None:
            texts = sorted((t.content for t in self.backend.get_added_tokens_decoder().values() if t.special),
                           key=len, reverse=True)
            self._specials = re.compile("|".join(map(re.escape, texts))) if texts else None

    def max_token_chars(self) -> int | None:
        """The most characters of input one token can stand for (an upper bound: 4x the longest
        vocabulary entry when a normalizer may compose characters), None without a fast tokenizer."""
        if self.backend is None:
            return None
        longest = max(len(t) for t in self.backend.get_vocab(with_added_tokens=True))
        return longest * (1 if self.backend.normalizer is None else 4)

    def turn_special_tokens(self) -> int:
        """The fewest special tokens the chat template adds for a message (ChatML: ``<|im_start|>``
        and ``<|im_end|>``). A message's content never merges with them, so n messages hold at least
        n times this many tokens, whatever they say; 0 when unknown (no template, no fast tokenizer)."""
        if self.backend is None or not getattr(self.tokenizer, "chat_template", None):
            return 0
        special = {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        try:
            base = [{"role": "user", "content": "x"}]
            count = sum(i in special for i in self.render(base))
            more = [sum(i in special for i in self.render([*base, {"role": role, "content": "x"}])) - count
                    for role in ("user", "assistant", "system")]
        except Exception:  # noqa: BLE001 - a template that refuses such turns: nothing known
            return 0
        return max(0, min(more))

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """The bytes each token stands for on its own (a byte-level token may be part of a UTF-8
        character), for logprobs' ``token`` and ``bytes``."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer; token texts are unknown")
        if self._token_bytes is None:
            self._token_bytes = TokenBytes(self.tokenizer)
        return self._token_bytes.of(ids)

    def encode(self, text: str) -> list[int]:
        """Plain text (no special tokens added; the special-token texts in it are parsed as such)."""
        if self.backend is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        return self._pieces.encode(text) if self._pieces is not None else _encode(self.backend, text)

    def render(self, messages: list[dict]) -> list[int]:
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ValueError("this model has no tokenizer; send token ids")
        msgs = [{"role": m["role"], "content": _text_of(m.get("content"))} for m in messages]
        if not getattr(tokenizer, "chat_template", None):
            text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
            return tokenizer.encode(text)
        if self.backend is None:
            return tokenizer.encode(self._text(msgs), add_special_tokens=False)
        if self._specials is not None and any(self._specials.search(m["content"]) for m in msgs):
            return self._render_guarded(msgs)
        return self._encode(self._text(msgs))

    def _text(self, msgs: list[dict]) -> str:
        """The template rendered (generation prompt added) for plain ``{role, content}`` messages."""
        if self._template is not None:
            return self._template.render(msgs)
        return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def _render_guarded(self, msgs: list[dict]) -> list[int]:
        """The template rendered around markers; the contents encoded with special tokens spelled out."""
        if self._plain is None:
            from tokenizers import Tokenizer

            self._plain = Tokenizer.from_str(self.backend.to_str())
            self._plain.encode_special_tokens = True
        marked = [{"role": m["role"], "content": _MARK.format(i)} for i, m in enumerate(msgs)]
        text = self._text(marked)
        ids: list[int] = []
        pos = 0
        for mark in _MARKS.finditer(text):
            ids += self._encode(text[pos:mark.start()])
            ids += _encode(self._plain, msgs[int(mark.group(1))]["content"])
            pos = mark.end()
        return ids + self._encode(text[pos:])


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins (GPT-2's table): character -> the byte it stands for.
    Printable Latin-1 bytes stand for themselves; the 68 others are shifted past 255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in keep}
    shifted = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _is_byte_level(tokenizer) -> bool:  # noqa: ANN001 - a transformers tokenizer
    """Whether the tokenizer's pieces are byte-level BPE (GPT-2's table), as its decoder says; a
    SentencePiece piece such as "é" would otherwise read as the Latin-1 byte it also spells."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is not None:
        return b'"type":"ByteLevel"' in decoder.__getstate__()
    return hasattr(tokenizer, "byte_decoder")  # a slow (Python) GPT-2-style tokenizer


class TokenBytes:
    """The bytes of single tokens: byte-level BPE pieces through GPT-2's table, SentencePiece
    pieces with ``▁`` as a space and ``<0xAB>`` byte fallbacks, added tokens (``<|im_end|>``) as
    their text. (Not memoised here: ``gateway.formats.TokenNames`` keeps what it shows per id.)"""

    def __init__(self, tokenizer) -> None:  # noqa: ANN001 - a transformers tokenizer
        self.tokenizer = tokenizer
        self.added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self.alphabet = _byte_level_alphabet() if _is_byte_level(tokenizer) else None

    def of(self, ids: list[int]) -> list[bytes]:
        return [self._bytes(i, piece) for i, piece in zip(ids, self.tokenizer.convert_ids_to_tokens(ids), strict=True)]

    def _bytes(self, token_id: int, piece: str | None) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        if piece is None:
            return b""
        if self.alphabet is not None and all(c in self.alphabet for c in piece):  # byte-level BPE
            return bytes(self.alphabet[c] for c in piece)
        if (m := _SP_BYTE.fullmatch(piece)) is not None:  # SentencePiece byte fallback
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode()


class ChatTemplate:
    """The tokenizer's chat template, compiled once by transformers and rendered directly: the text
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` gives for plain
    ``{role, content}`` string messages (~17 µs for a short chat instead of ~38 µs: that call also
    normalises and copies the messages, looks the template up and checks options on every call).
    The template sees what transformers hands it: the messages, ``tools``/``documents`` None, the
    generation prompt flag and the special tokens. ``for_tokenizer`` returns None, and callers use
    ``apply_chat_template``, when transformers' compiler is not where this expects it or the two
    disagree on probe chats."""

    PROBES = (
        [{"role": "user", "content": "Say hi."}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo 🌍\n\tok "}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": ""}],
    )

    def __init__(self, compiled, kwargs: dict) -> None:  # noqa: ANN001 - a jinja2 Template
        self._compiled = compiled
        self._kwargs = kwargs

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ChatTemplate | None:  # noqa: ANN001
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

            source = tokenizer.get_chat_template()
            template = cls(_compile_jinja_template(source), _plain_template_data(dict(tokenizer.special_tokens_map)))
            agree = all(template.render(p) == tokenizer.apply_chat_template(p, add_generation_prompt=True,
                                                                            tokenize=False) for p in cls.PROBES)
        except Exception as exc:  # no template, another transformers, a template refusing a probe
            log.debug("chat template rendered through apply_chat_template: %r", exc)
            return None
        if not agree:
            log.debug("chat template rendered through apply_chat_template: the probes differ")
            return None
        return template

    def render(self, msgs: list[dict]) -> str:
        return self._compiled.render(messages=msgs, tools=None, documents=None, add_generation_prompt=True,
                                     **self._kwargs)


class PieceCache:
    """A text's token ids put together from its pieces between added tokens, the ids of each piece
    remembered (least recently used out first).

    A Hugging Face tokenizer splits its input at its added tokens (``<|im_start|>``, ...) before
    anything else and encodes each piece on its own, so the ids of a rendered chat are the added
    tokens' ids between those of the pieces. The pieces that come back request after request (an
    application's system prompt, the template's ``assistant\\n``) are then encoded once: a
    1,200-token system prompt costs ~27 µs of the event loop per request instead of ~1.3 ms, a
    short chat ~23 µs instead of ~46 µs. Used only for tokenizers whose added tokens take no
    whitespace from their neighbours (no ``lstrip``/``rstrip``/``single_word``) and match the
    text as it is (not normalised, or no normaliser), and whose full encode agrees with the
    pieces' on probe texts; otherwise ``for_backend`` returns None and texts are encoded whole.
    Safe to share between threads (a long prompt is rendered on a worker thread)."""

    MAX_ENTRIES = 1024
    MAX_CHARS = 2_000_000  # all remembered pieces together (~0.5M tokens, ~20 MB at most)
    MAX_PIECE_CHARS = 256_000  # a longer piece is encoded every time

    def __init__(self, backend, added: dict[str, int]) -> None:  # noqa: ANN001 - a tokenizers.Tokenizer
        self.backend = backend
        self._added = added
        self._split = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))) if added else None
        self._lru: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @classmethod
    def for_backend(cls, backend) -> PieceCache | None:  # noqa: ANN001
        tokens = list(backend.get_added_tokens_decoder().items())
        plain_match = backend.normalizer is None
        for _, t in tokens:
            if t.lstrip or t.rstrip or t.single_word or (t.normalized and not plain_match):
                return None
        cache = cls(backend, {t.content: i for i, t in tokens})
        names = [t.content for _, t in tokens[:3]] or [""]
        a, b = names[0], names[-1]
        probes = [f"{a}system\nYou are terse.{b}\n{a}user\n  héllo 🌍\n\n{b}\n{a}assistant\n",
                  f" {a} {b}{b}x{a}\t", "plain text, no added token at all"]
        if any(cache.encode(p) != _encode(backend, p) for p in probes):
            return None
        return cache

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        pos = 0
        if self._split is not None:
            for m in self._split.finditer(text):
                if m.start() > pos:
                    ids += self._piece(text[pos:m.start()])
                ids.append(self._added[m.group()])
                pos = m.end()
        if pos < len(text):
            ids += self._piece(text[pos:] if pos else text)
        return ids

    def __len__(self) -> int:
        return len(self._lru)

    def _piece(self, piece: str) -> list[int]:
        """The piece's ids (a remembered list: callers copy it, never change it)."""
        with self._lock:
            ids = self._lru.get(piece)
            if ids is not None:
                self._lru.move_to_end(piece)
                return ids
        ids = _encode(self.backend, piece)  # outside the lock: a long piece releases the GIL
        if len(piece) <= self.MAX_PIECE_CHARS:
            with self._lock:
                if piece not in self._lru:
                    self._lru[piece] = ids
                    self._chars += len(piece)
                    while len(self._lru) > self.MAX_ENTRIES or self._chars > self.MAX_CHARS:
                        old, _ = self._lru.popitem(last=False)
                        self._chars -= len(old)
        return ids


def _encode(backend, text: str) -> list[int]:  # noqa: ANN001 - a tokenizers.Tokenizer
    if not text:
        return []
    if len(text) > LONG_TEXT_CHARS:
        return backend.encode_batch([text], add_special_tokens=False)[0].ids
    return backend.encode(text, add_special_tokens=False).ids


def render_chat(tokenizer, messages: list[dict]) -> list[int]:  # noqa: ANN001
    """``ChatRenderer(tokenizer).render(messages)``, for one-off use (a renderer is worth keeping)."""
    return ChatRenderer(tokenizer).render(messages)
