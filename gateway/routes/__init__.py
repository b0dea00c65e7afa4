"""One router per resource; ``ROUTERS`` is what ``create_app`` mounts."""

from gateway.routes import chat, completions, embeddings, health, models

ROUTERS = [chat.router, completions.router, models.router, embeddings.router, health.router]
