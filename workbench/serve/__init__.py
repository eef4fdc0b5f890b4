"""An OpenAI-compatible HTTP server on the engine (FastAPI and uvicorn: `pip install
'workbench[serve]'`): `LLM.serve()`, `Workbench.serve()` or `python -m workbench serve`.

Two processes. The engine's (a notebook's, or the command's) keeps the engine, a thread that
steps it (`loop.py`) and the server's handle (`server.py`). The HTTP process (`front.py`)
runs uvicorn and the routes (`app.py`), checks each request (`protocol.py`) against the
engine's limits (`service.py`), detokenises and streams each answer (`output.py`) and keeps
`/metrics` (`metrics.py`). Requests go to the engine, one message a step comes back. FastAPI,
uvicorn and prometheus_client are imported by the HTTP process alone."""

from .loop import Host
from .server import Server
from .service import MAX_QUEUED_REQUESTS

__all__ = ["MAX_QUEUED_REQUESTS", "Host", "Server"]
