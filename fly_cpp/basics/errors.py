"""The one exception type users see.

Every failure a user can cause (a bad path, an incompatible draft, a prompt that does not fit)
is raised as :class:`FlyError` with a message that fits on one line and names the culprit. The
CLI prints it as ``error: <message>``; the server turns it into an HTTP 400.
"""


class FlyError(ValueError):
    """A user-facing error: one clear line, no traceback needed."""


class UsageError(FlyError, TypeError):
    """Arguments that do not go together (e.g. two sources for one model). The CLI exits with
    status 2 for it, as for any bad command line; Python callers may catch it as TypeError."""


class ContextExceeded(FlyError):
    """A prompt longer than the context (the server answers llama-server's
    ``exceed_context_size_error`` with both numbers)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        # llama-server's words ("exceeds the available context size"): clients look for them
        super().__init__(f"the prompt is {n_prompt_tokens} tokens, longer than the context (n_ctx={n_ctx}): "
                         "the request exceeds the available context size")
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class CacheFull(FlyError):
    """llama.cpp found no room for a decode in the KV cache: the slots sharing one cache
    (``kv_unified``) filled it together. The server's limit, not the request's fault (HTTP 500
    in llama-server's words, "the context size has been exceeded")."""


class RpcServerLost(FlyError):
    """An rpc-server holding model layers stopped answering: the models on it are gone until
    the process restarts (the server answers HTTP 503)."""
