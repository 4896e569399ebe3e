"""Drift check of the async-MoE pipeline body (the facts ``patches.forward`` relies on).

afd-plugin main 2e4378f and release/v0.19.1rc1 2f4f462,
``model_executor/models/npu/deepseek_v2_async_cam_forward.py``
``run_async_moe_ubatch_afd_forward``: it reads only ``model.config``,
``model.start_layer``, ``model.end_layer`` and ``model.layers``; runs the layers
before ``config.first_k_dense_replace`` on the whole batch, returns when
``dense_end_layer == model.end_layer``, and slices each stage's rows by
``UBatchSlice.token_slice``. Checked with ``ast`` at install: on drift PCP stages
are refused naming it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

MODEL_ATTRIBUTES_READ = frozenset({"config", "start_layer", "end_layer", "layers"})
"""What upstream's pipeline reads of ``model`` at both pinned commits (``LayerRange`` gives
exactly these)."""


def forward_drift(function) -> str | None:
    """Why the installed pipeline no longer reads as ``run_relaid`` relies on (None: it does)."""
    return forward_drift_in(inspect.getsource(function))


def forward_drift_in(source: str) -> str | None:
    tree = ast.parse(textwrap.dedent(source))
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))
    model = function.args.args[0].arg
    read = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == model}
    if not read <= MODEL_ATTRIBUTES_READ:
        return f"it reads {sorted(read - MODEL_ATTRIBUTES_READ)} of the model"
    text = {ast.unparse(node) for node in ast.walk(function)
            if isinstance(node, ast.Attribute | ast.Compare)}
    for needed in (f"{model}.config.first_k_dense_replace", f"dense_end_layer == {model}.end_layer",
                   "ubatch_slice.token_slice"):
        if needed not in text:
            return f"it no longer reads {needed!r}"
    return None
