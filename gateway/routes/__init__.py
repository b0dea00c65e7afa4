"""One router per resource; ``ROUTERS`` is what ``create_app`` mounts.

``DIRECT``: the two generation routes as ``gateway.middleware.GatewayMiddleware`` serves them, by
path, without FastAPI's per-request machinery (route matching, dependency solving, its body
reading, two exit stacks and another ``send`` wrapper); with the middlewares merged, the event
loop's CPU per request at 50 clients went to 0.71x (``bench/gateway_http.py``). Same models, same
services, same errors, in FastAPI's order (``gateway.deps.read_and_admit``); FastAPI keeps
declaring them (the OpenAPI document) and serves every other route."""

from gateway.routes import chat, completions, embeddings, health, models

ROUTERS = [chat.router, completions.router, models.router, embeddings.router, health.router]
DIRECT = {"/v1/chat/completions": chat.serve, "/v1/completions": completions.serve}
