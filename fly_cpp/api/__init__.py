"""The Python API (``fly.Fly``) and the OpenAI/llama-cpp-python shapes it answers in: chat formats, tool calls, replies, structured output."""
