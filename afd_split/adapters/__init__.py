"""Adapters between ``afd_split.BatchMetadata`` and serving-stack metadata types.

Each adapter imports its framework lazily, inside the functions that need it,
so ``import afd_split`` never pulls in vLLM or torch-npu.
"""
