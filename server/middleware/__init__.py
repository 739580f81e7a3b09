"""ASGI middleware around every route: the error guard, body limits and CORS."""
