"""Pinned field lists of the engine metadata classes the adapters split (package data).

One JSON file per class and upstream revision: ``class``, ``module``, ``version``,
``commit``, ``source`` (where the list was read), ``fields`` (declaration order),
``required``, ``defaults`` (scalar defaults: a REJECT_WHEN_SET field is "set" when it
differs from its default), ``properties`` (deprecated ``*_cpu`` properties) and, for
vLLM-Ascend, ``own_fields``, ``factories``, ``attn_state_enum`` and ``nested``.

* ``vllm-<version>.json``: read from the installed PyPI wheel
  (``dataclasses.fields(vllm.v1.attention.backend.CommonAttentionMetadata)``,
  commit id from ``vllm/_version.py``).
* ``vllm-ascend-<tag>.json``: the base list of the vLLM version the tag's Dockerfile
  pins (``VLLM_TAG``) plus the subclass's own annotated fields, read from
  ``vllm_ascend/attention/utils.py`` at the recorded commit of vllm-project/vllm-ascend.

A new upstream release gets a new file (and rules for any new field) only after its
class was read; tests/adapters checks every file's fields have a rule.
"""
