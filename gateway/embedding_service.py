"""POST /v1/embeddings as a plain function: model check, quota on the input tokens, the
embedder on its own thread, OpenAI's ``float`` or ``base64`` encoding, one usage row."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import Response

from gateway.accounting import RequestAccount
from gateway.auth import Principal
from gateway.deps import Caller
from gateway.disconnect import until_done_or_disconnect
from gateway.embedder import AtLeast
from gateway.errors import ApiError, invalid_request, model_not_found, permission_denied, unsupported
from gateway.schemas import EmbeddingItem, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from gateway.settings import Settings

# the other names of the bundled MiniLM that /v1/embeddings takes (in lower case)
EMBEDDING_ALIASES = frozenset({"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"})


def embedding_model_id(settings: Settings) -> str:
    return settings.embedding_model


def is_embedding_model(settings: Settings, model: str) -> bool:
    served = embedding_model_id(settings)
    return model == served or model.lower() in EMBEDDING_ALIASES | {served.lower()}


def may_use_embedding_model(principal: Principal, settings: Settings) -> bool:
    """A key may use the embedding model when it allows it by any of its names (the served id or an
    alias, any case): the names are one model (found by QA: a key allowing it by an alias was listed
    the model, then refused it under its served id)."""
    return principal.allowed_models is None or any(is_embedding_model(settings, m) for m in principal.allowed_models)


def _check_model(caller: Caller, model: str) -> str:
    served = embedding_model_id(caller.state.settings)
    if not is_embedding_model(caller.state.settings, model):
        engine = caller.state.engine
        chat = engine is not None and model == engine.model_id and caller.principal.may_use(model)
        raise model_not_found(model, "/v1/chat/completions and /v1/completions (a chat model)" if chat else None)
    if not may_use_embedding_model(caller.principal, caller.state.settings):
        raise permission_denied(f"This API key is not allowed to use the model `{model}`.",
                                code="model_not_allowed")
    return served


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


async def create_embeddings(body: EmbeddingRequest, caller: Caller) -> EmbeddingList | Response:
    model = _check_model(caller, body.model)
    if body.token_ids():
        raise unsupported("input", "Token ids as input are not supported: send the text, as a string or a list of "
                                   f"strings ({model} reads it with its own tokenizer). LangChain's OpenAIEmbeddings "
                                   "sends token ids unless given check_embedding_ctx_length=False.")
    texts = body.inputs()
    empty = next((i for i, t in enumerate(texts) if not t), None)
    if empty is not None:  # the item named, as /v1/completions names prompt[i] (found by QA)
        raise invalid_request("Input must not contain empty strings.",
                              param="input" if isinstance(body.input, str) else f"input[{empty}]")
    embedder = await caller.state.get_embedder()
    if body.dimensions is not None and body.dimensions > embedder.dimensions:
        raise invalid_request(f"dimensions must be at most {embedder.dimensions} for {model}.",
                              param="dimensions")
    limit = embedder.max_input_tokens
    share = caller.principal.tenant_id  # tenants take turns on the embedder's thread
    counts = await embedder.acount_tokens(texts, stop_over=limit, share=share)  # a refusal stops at the first too long
    too_long = next((i for i, n in enumerate(counts) if n > limit), None)
    if too_long is not None:  # as OpenAI and vLLM: refused, not silently cut
        which = "Your input" if isinstance(body.input, str) else f"Input {too_long}"
        has = f"at least {counts[too_long]}" if isinstance(counts[too_long], AtLeast) else f"{counts[too_long]}"
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. {which} has "
                            f"{has} tokens. Please shorten it.", "invalid_request_error",
                       "context_length_exceeded", "input" if isinstance(body.input, str) else f"input[{too_long}]")
    prompt_tokens = sum(counts)
    account = RequestAccount(caller.state.services, caller.principal, request_id=caller.request_id,
                             model=model, endpoint="embeddings", started=caller.started)
    await account.reserve(prompt_tokens=prompt_tokens, max_tokens=0)
    caller.response_headers.update(account.headers)
    status = "error"
    got: list[np.ndarray] = []

    async def embed() -> None:
        got.append(await embedder.aembed(texts, share=share))

    try:
        # a client that leaves stops its batch at the next part, and pays nothing (found by a security
        # QA: a 2,048-text batch ran 90 s on after its client had gone, slowing everyone's embeddings,
        # and its row said ok with 495,616 tokens billed)
        if not await until_done_or_disconnect(embed(), caller.receive):
            status = "aborted"
            return Response(status_code=499)  # nobody is listening any more
        vectors = got[0]
        if body.dimensions is not None and body.dimensions < vectors.shape[1]:
            vectors = vectors[:, : body.dimensions]  # shortened like OpenAI's v3 models: renormalised
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        status = "ok"
    finally:
        await account.close_surely(status=status, prompt_tokens=prompt_tokens if status == "ok" else 0)
    return EmbeddingList(
        model=model,
        data=[EmbeddingItem(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)],
        usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
    )
