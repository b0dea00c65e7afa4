"""POST /v1/completions (legacy text completions)"""

from fastapi import APIRouter
from starlette.responses import Response

from gateway.chat_service import create_completion
from gateway.deps import CallerDep
from gateway.schemas import Completion, CompletionRequest

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def completions(body: CompletionRequest, caller: CallerDep) -> Response:
    """OpenAI text completions of one prompt (text or token ids)."""
    return await create_completion(body, caller)
