"""POST /v1/embeddings (the bundled all-MiniLM-L6-v2)"""

from fastapi import APIRouter

from gateway.deps import CallerDep, ReadableBodyDep
from gateway.embedding_service import create_embeddings
from gateway.schemas import EmbeddingList, EmbeddingRequest

router = APIRouter(tags=["embeddings"], strict_content_type=False)  # a body without content-type is JSON


@router.post("/v1/embeddings", response_model=EmbeddingList)
async def embeddings(body: EmbeddingRequest, _readable: ReadableBodyDep, caller: CallerDep) -> EmbeddingList:
    return await create_embeddings(body, caller)
