"""GET /v1/models and GET /v1/models/{id}: the served chat model and the embedding model, as far
as the caller's key may use them."""

from fastapi import APIRouter

from gateway.deps import Caller, CallerDep
from gateway.embedding_service import embedding_model_id, is_embedding_model, may_use_embedding_model
from gateway.error_handlers import unknown_url
from gateway.errors import model_not_found
from gateway.schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


def _cards(caller: Caller) -> list[ModelCard]:
    state = caller.state
    created = int(state.started_at)
    cards = []
    if state.engine is not None:
        cards.append(ModelCard(id=state.engine.model_id, created=created,
                               max_model_len=state.engine.max_model_len))
    served = embedding_model_id(state.settings)
    cards.append(ModelCard(id=served, created=created, max_model_len=256))
    principal = caller.principal
    embedding = may_use_embedding_model(principal, state.settings)  # by any of its names
    return [c for c in cards if (embedding if c.id == served else principal.may_use(c.id))]


@router.get("/v1/models", response_model=ModelList)
@router.head("/v1/models", include_in_schema=False)  # HEAD: the same answer without its body
async def list_models(caller: CallerDep) -> ModelList:
    return ModelList(data=_cards(caller))


@router.get("/v1/models/{model_id:path}", response_model=ModelCard)
@router.head("/v1/models/{model_id:path}", include_in_schema=False)
async def get_model(model_id: str, caller: CallerDep) -> ModelCard:
    if not model_id:  # "/v1/models/": an unknown URL (a trailing slash), not a model named ""
        raise unknown_url()
    embedding = is_embedding_model(caller.state.settings, model_id)  # its aliases too, as /v1/embeddings takes them
    served_embedding = embedding_model_id(caller.state.settings)
    for card in _cards(caller):
        if card.id == model_id or (embedding and card.id == served_embedding):
            return card
    raise model_not_found(model_id)
