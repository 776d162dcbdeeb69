"""The bundled default pair: stories260K (a real tiny llama trained on TinyStories) and a
draft derived from it, so that fly-cpp works on a fresh install with no model arguments."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "stories260K" / "stories260K.gguf"
DRAFT = HERE / "stories260K" / "stories260K-draft.gguf"
N_CTX = 512  # the context it was trained on (its GGUF header says 2048)
