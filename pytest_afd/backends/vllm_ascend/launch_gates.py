"""``afd-launch-plan --for-gates``: the deployments ``pytest -m gate`` can run its split path on.

The plain plan is the recipe's (forced routing, W8A8, ``max_num_seqs=32``): the
gates attached to it skip every split-path case, since they compare the split
against an unsplit reference at the RunSettings defaults (natural routing, no
quantization, ``max_num_seqs=8``, 128-token pages) and gate 1's live reference
runs ``split_policy=none`` on a second deployment. ``--for-gates`` prints both:

1. the gates' split deployment (``--split token_balanced`` at those settings);
2. gate 1's split-none reference deployment (``--split none``, same settings),
   on its own nodes (``--node-address`` twice the plan's node count: the first
   half for 1, the second for 2; both run at once);

with the ``AFD_ASCEND_DEPLOYMENTS`` file that attaches the harness to both.
The gate cases with other settings (chunked prefill, prefix caching, W8A8,
more requests than 8) need further deployments: an attached session lists what
it lacked in ``summary.json`` (``gate_runs.needs``), and the deploy-command mode
(``AFD_ASCEND_DEPLOY_COMMAND``) or the launch mode starts each on first use. A
``--afd-reference-phase check`` session loads stored references and needs no
split-none deployment.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pytest_afd.backends.vllm_ascend.plan import ENV_ATTACH_URL, LaunchOptions, LaunchPlanError
from pytest_afd.core.backend import RunSettings
from pytest_afd.topology.spec import Topology, TopologyError, parse_topology

GATE_SPLIT = "token_balanced"
REFERENCE_SPLIT = "none"
ROLE_GATES = "gates: the split path (token_balanced)"
ROLE_REFERENCE = "gate 1's split-none reference (split_policy=none)"
ENV_DEPLOYMENTS = "AFD_ASCEND_DEPLOYMENTS"
DEFAULTS = RunSettings()
# What --for-gates sets (the gate cases' RunSettings defaults); anything else is the user's.
GATE_FIELDS = {"routing": DEFAULTS.routing, "quantization": DEFAULTS.quantization,
               "max_num_seqs": DEFAULTS.max_num_seqs, "block_size": DEFAULTS.block_size,
               "max_num_batched_tokens": DEFAULTS.max_num_batched_tokens,
               "chunk_size": None, "prefix_caching": False}
NOT_COVERED = ("gate cases with chunked prefill, prefix caching, W8A8 or more than "
               f"{DEFAULTS.max_num_seqs} requests need further deployments: an attached session "
               "lists them in summary.json (gate_runs.needs); AFD_ASCEND_DEPLOY_COMMAND deploys "
               "each on first use; a --afd-reference-phase check session needs no split-none "
               "deployment")


def gate_options(options: LaunchOptions, split: str) -> LaunchOptions:
    """``options`` with the gates' settings and ``split`` (the serving role's ``--dev-mode``:
    the gates reset the prefix cache between cases)."""
    return dataclasses.replace(options, split=split, dev_mode=True, **GATE_FIELDS)


def gate_plans(topology: str | Topology, options: LaunchOptions, build: Any) -> list[dict[str, Any]]:
    """The two deployments (role, plan) the gates' split path needs; ``build`` is
    ``build_launch_plan`` (passed in: this module is imported by it)."""
    try:
        parsed = parse_topology(topology) if isinstance(topology, str) else topology
    except TopologyError as error:
        raise LaunchPlanError(str(error)) from error
    if not parsed.is_afd:
        raise LaunchPlanError(
            f"--for-gates: --npu-topology {parsed.canonical} is co-located; the gates' split "
            "path runs on an AFD topology (Attention and FFN parts, e.g. dp3pcp8-ep8)")
    nodes = parsed.nodes_needed(options.devices_per_node)
    addresses = options.node_addresses
    if len(addresses) != 2 * nodes:  # two deployments at once
        raise LaunchPlanError(
            f"--for-gates: {parsed.canonical} needs {nodes} node(s) of {options.devices_per_node} "
            f"per deployment and the split-none reference runs beside the split deployment: give "
            f"{2 * nodes} --node-address (the first {nodes} for the split deployment, the next "
            f"{nodes} for the reference), got {len(addresses)}")
    halves = (addresses[:nodes], addresses[nodes:])
    return [{"role": role, "plan": build(parsed, dataclasses.replace(
                gate_options(options, split), node_addresses=half))}
            for (role, split), half in zip(((ROLE_GATES, GATE_SPLIT),
                                            (ROLE_REFERENCE, REFERENCE_SPLIT)), halves, strict=True)]


def deployments_file(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``AFD_ASCEND_DEPLOYMENTS`` entries attaching the harness to both deployments."""
    return [{"url": item["plan"].attach_env()[ENV_ATTACH_URL],
             "settings": dict(item["plan"].run_settings)} for item in plans]


def format_json(plans: list[dict[str, Any]]) -> str:
    doc = {"deployments": [{"role": item["role"], "plan": item["plan"].to_json()}
                           for item in plans],
           ENV_DEPLOYMENTS: deployments_file(plans), "not_covered": NOT_COVERED}
    return json.dumps(doc, indent=2) + "\n"


def format_text(plans: list[dict[str, Any]]) -> str:
    parts = []
    for index, item in enumerate(plans, 1):
        parts.append(f"# ==== deployment {index} of {len(plans)}: {item['role']} ====\n"
                     + item["plan"].format_text())
    listing = json.dumps(deployments_file(plans), sort_keys=True)
    parts.append(f"# attach the gates to both: write this to a file and set {ENV_DEPLOYMENTS} "
                 f"to its path:\n# {listing}\n# {NOT_COVERED}\n")
    return "\n".join(parts)
