"""The engine layer: split vLLM / vLLM-Ascend attention metadata objects per ubatch.

Imports the plan, checks and pcp layers; the hook builds on it.

``vllm`` (``split_common_metadata``) and ``ascend`` (``split_ascend_common_metadata``)
are the entry points; ``layout`` holds the pinned field lists and the run-time drift
check, ``common`` / ``slicing`` the shared rule-driven split and device-side slicing,
``compiled`` the rule table compiled once per engine class into a generated split
function, ``debug`` the token-level check, ``rows`` / ``state`` the row moves and the state guard around a split
forward. Nothing here imports vLLM, vLLM-Ascend or torch at
import time: the engine objects come from the caller and torch is imported lazily.
"""
