"""fly-cpp: loosely speculative decoding (FLy) on llama.cpp.

A small GGUF draft model guesses k tokens ahead; the GGUF target checks them in one batched
forward pass and keeps exact matches and, under FLy, mismatches the target was unsure about
and then agreed with the draft after.
"""

from fly_cpp.api import Fly
from fly_cpp.chat_format import ChatFormat
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine import Engine
from fly_cpp.generation import Generation
from fly_cpp.errors import FlyError
from fly_cpp.step import Stats, Step

__all__ = ["ChatFormat", "Engine", "Fly", "FlyError", "Generation", "ModelSettings", "SamplingSettings", "SpecSettings", "Stats", "Step"]
__version__ = "0.1.0"
