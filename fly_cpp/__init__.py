"""fly-cpp: loosely speculative decoding (FLy) on llama.cpp.

A small GGUF draft model guesses k tokens ahead; the GGUF target checks them in one batched
forward pass and keeps exact matches and, under FLy, mismatches the target was unsure about
and then agreed with the draft after.
"""

from fly_cpp.api.chat_format import ChatFormat
from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine.engine import Engine
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.step import Stats, Step

__all__ = ["ChatFormat", "Engine", "Fly", "FlyError", "Generation", "ModelSettings", "SamplingSettings", "SpecSettings", "Stats", "Step"]
__version__ = "0.1.0"
