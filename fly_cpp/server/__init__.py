"""``fly-cpp serve``: llama-server's and OpenAI's HTTP dialects over one ``Fly`` pair.

- ``app``: the factory, ``create_app(fly, settings=ServerSettings(...))`` (no module globals).
- ``fields``: request bodies; their sampling and speculative fields come from the settings
  dataclasses. ``compat``: the fields accepted but not used, and what happens to unknown ones.
- ``prepare``: a body's CPU work (template, tokens, truncation), off the event loop.
- ``worker``: the engine's thread; generations run there one at a time, in arrival order.
  ``runs``: generations as the event loop sees them.
- ``llama`` / ``oai``: the llama-server and the OpenAI endpoints; ``page``: the chat page.
- ``served``: the pair, loaded in the background while /health says "Loading model".
- ``connections``: uvicorn's protocol with a header timeout and a connection cap.
- ``bodies``, ``auth``, ``errors``, ``metrics``, ``timings``, ``probs``, ``sse``: one job each.
"""

from fly_cpp.server.app import create_app

__all__ = ["create_app"]
