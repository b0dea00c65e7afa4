"""POST /v1/completions (legacy text completions)"""

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.chat_service import create_completion
from gateway.deps import CallerDep, authenticate_and_limit, json_body
from gateway.schemas import Completion, CompletionRequest

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def completions(body: CompletionRequest, caller: CallerDep) -> Response:
    """OpenAI text completions of one prompt (text or token ids)."""
    return await create_completion(body, caller)


async def serve(request: Request) -> Response:
    """The same route as the gateway's middleware serves it (``gateway.routes.DIRECT``)."""
    caller = await authenticate_and_limit(request)
    return await create_completion(await json_body(request, CompletionRequest), caller)
