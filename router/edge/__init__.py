"""The router's HTTP edge: its server (uvicorn with head limits and a drain), the ASGI hot path and
middleware, and request bodies read and decoded within bounds."""
