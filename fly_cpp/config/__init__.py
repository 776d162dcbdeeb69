"""Settings, as frozen dataclasses validated on creation, one module each (what they share:
``checks``).

The CLI options and the server's request fields are derived from these fields (their
``metadata["help"]`` is the one place an option is described), so a setting is declared once.
"""

from fly_cpp.config.checks import (
    AUTO,
    AUTO_SLOTS,
    CACHE_TYPES,
    DRAWS,
    FLASH_ATTN,
    FLY_RULES,
    LOOSEN,
    MAX_CTX,
    MAX_SEED,
    MAX_THREADS,
    MODES,
    ROLLBACK,
    SPEC_TYPES,
    SPLIT_MODES,
    STEADY,
    THREADS_PER_CPU,
    cpu_cores,
    max_threads,
)
from fly_cpp.config.model import ModelSettings
from fly_cpp.config.sampling import SamplingSettings
from fly_cpp.config.server import ServerSettings
from fly_cpp.config.spec import SpecSettings

__all__ = ["AUTO", "AUTO_SLOTS", "CACHE_TYPES", "DRAWS", "FLASH_ATTN", "FLY_RULES", "LOOSEN", "MAX_CTX", "MAX_SEED",
           "MAX_THREADS", "MODES", "ROLLBACK", "SPEC_TYPES", "SPLIT_MODES", "STEADY", "THREADS_PER_CPU",
           "ModelSettings", "SamplingSettings", "ServerSettings", "SpecSettings", "cpu_cores", "max_threads"]
