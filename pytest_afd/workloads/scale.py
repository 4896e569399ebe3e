"""How far the stages' workloads are scaled down per backend (``--afd-stage-scale``).

Here, below both the options and the study, because a frozen study records the scale a
backend's stages run at by default, and the options resolve the same default.
"""

from types import MappingProxyType

# Backends that need scaled-down stages to run in minutes; the rest run at FULL_SCALE.
DEFAULT_STAGE_SCALES = MappingProxyType({"cpu": 1 / 64})
FULL_SCALE = 1.0
