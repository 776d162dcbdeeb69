"""Where fly-cpp touches llama.cpp: the only package that imports ``llama_cpp`` (llama-cpp-python's
low-level API), one module per concern (``tests/test_layout.py`` keeps it so).

- ``lib``: the library itself: loading, initialising, its log, what the build has;
- ``model``: GGUF files and loaded weights (``Model``, ``gguf_hparams``, ``quantize``);
- ``cache``: one sequence's KV cache and its rollback (``Cache``, ``common_prefix``);
- ``context``: ``Context``, a llama.cpp context with one sequence or several;
- ``batch``: several sequences decoded in shared batches (``Batcher``, ``Seq``);
- ``mtp``: ``MtpContext``, a model's MTP head;
- ``grammar``: llama.cpp's grammar sampler and JSON-schema grammars;
- beside them, what reads a context's rows without llama-cpp-python: ``rows`` and ``native`` (the
  C helper), ``sampling`` (llama.cpp's sampler chain over a row), ``rollback`` (a recurrent
  cache's ways back), ``rpc`` (rpc-servers), ``fit`` (what fits where: layers, memory).
"""
