"""Model sources: the rules of resolve() (no download needed)."""

from __future__ import annotations

import pytest

from fly_cpp.basics.errors import FlyError, UsageError
from fly_cpp.models import bundled, sources


def test_nothing_named_is_the_bundled_pair():
    got = sources.resolve()
    assert (got.target, got.draft, got.defaults) == (str(bundled.TARGET), str(bundled.DRAFT), {"n_ctx": bundled.N_CTX})
    assert sources.resolve("t.gguf") == sources.Resolved("t.gguf", None)
    assert sources.resolve("t.gguf", "d.gguf") == sources.Resolved("t.gguf", "d.gguf")


@pytest.mark.parametrize("kwargs, python, cli", [
    ({"draft": "d.gguf"}, "a draft model (draft) needs a target model (target)", "(-d) needs a target model (-m)"),
    ({"hf_file": "f.gguf"}, "hf_file needs hf_repo", "--hf-file needs --hf-repo"),
    ({"target": "t.gguf", "hf_repo": "a/b", "hf_file": "f"}, "as target or as hf_repo, not both", "-m or as --hf-repo"),
    ({"hf_draft_file": "d.gguf"}, "hf_draft_file needs hf_draft_repo (or hf_repo)", "--hf-draft-file needs"),
    ({"pair": "costly", "target": "t.gguf"}, "pair names both models", "--pair names both models"),
    ({"pair": "no-such-pair"}, "unknown pair 'no-such-pair'", "unknown pair"),
])
def test_usage_errors_speak_the_callers_language(kwargs, python, cli):
    with pytest.raises(UsageError, match=python.replace("(", r"\(").replace(")", r"\)")):
        sources.resolve(**kwargs)
    with pytest.raises(UsageError, match=cli.replace("(", r"\(").replace(")", r"\)")):
        sources.resolve(**kwargs, names=sources.CLI)
    assert issubclass(UsageError, FlyError) and issubclass(UsageError, TypeError)
