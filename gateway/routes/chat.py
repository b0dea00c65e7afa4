"""POST /v1/chat/completions"""

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.chat_service import create_chat_completion
from gateway.deps import CallerDep, read_and_admit
from gateway.schemas import ChatCompletion, ChatCompletionRequest

router = APIRouter(tags=["chat"], strict_content_type=False)  # a body without content-type is JSON


@router.post("/v1/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def chat_completions(body: ChatCompletionRequest, caller: CallerDep) -> Response:
    """OpenAI chat completions; ``stream: true`` answers with ``chat.completion.chunk`` events."""
    return await create_chat_completion(body, caller)


async def serve(request: Request) -> Response:
    """The same route as the gateway's middleware serves it (``gateway.routes.DIRECT``)."""
    return await create_chat_completion(*await read_and_admit(request, ChatCompletionRequest))
