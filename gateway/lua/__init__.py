"""Redis Lua scripts (quota reservation, settlement, counter rebuild)."""
