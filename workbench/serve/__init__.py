"""An OpenAI-compatible HTTP server on the engine (`pip install 'workbench[serve]'`):
`LLM.serve()`, `Workbench.serve()` or `python -m workbench serve`. Two processes: the engine's
steps it (`loop.py`, `server.py`); the HTTP process (`front.py`) serves the routes, checks,
detokenises and streams, so its Python work takes nothing from the engine's steps."""

from .loop import Host
from .server import Server
from .service import MAX_QUEUED_REQUESTS

__all__ = ["MAX_QUEUED_REQUESTS", "Host", "Server"]
