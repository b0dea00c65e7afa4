"""POST /v1/completions (legacy text completions)"""

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.chat_service import create_completion
from gateway.deps import CallerDep, read_and_admit
from gateway.schemas import Completion, CompletionRequest

router = APIRouter(tags=["completions"], strict_content_type=False)  # a body without content-type is JSON


@router.post("/v1/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def completions(body: CompletionRequest, caller: CallerDep) -> Response:
    """OpenAI text completions of one prompt (text or token ids)."""
    return await create_completion(body, caller)


async def serve(request: Request) -> Response:
    """The same route as the gateway's middleware serves it (``gateway.routes.DIRECT``)."""
    return await create_completion(*await read_and_admit(request, CompletionRequest))
