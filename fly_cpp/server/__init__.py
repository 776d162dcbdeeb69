"""``fly-cpp serve``: llama-server's and OpenAI's HTTP dialects over one ``Fly`` pair.

- ``app``: the factory, ``create_app(fly, api_key=...)`` (no module globals).
- ``fields``: request bodies; their sampling and speculative fields come from the settings
  dataclasses.
- ``worker``: the engine's thread; generations run there one at a time, in arrival order.
- ``llama`` / ``oai``: the llama-server and the OpenAI endpoints.
- ``errors``, ``auth``, ``metrics``, ``probs``, ``sse``: one job each.
"""

from fly_cpp.server.app import create_app

__all__ = ["create_app"]
