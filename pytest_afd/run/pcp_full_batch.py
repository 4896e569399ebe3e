"""The gates' entry to the full-batch check under PCP (gates import no backend internals).

``full_batch_problems`` runs one PCP split step on every emulated rank through the
CPU backend's PCP emulation (``backends.cpu.pcp`` / ``pcp_builders``: the full batch
with builder 0, the stages with ``get_metadata_builder(ubid or 0)``, through the
stand-in builders' persistent buffers and the hook's own guard) and returns what
changed in the full batch across the stage builds (empty: bit-identical).
"""

from __future__ import annotations

import numpy as np

from afd_split.checks.metadata import BatchMetadata
from afd_split.hook.glue.pcp_seam import plan_pcp_step
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.stage import stage_tokens

BLOCK_SIZE = 128
"""The recipe's ``--block-size``."""


def builder_kinds() -> tuple[str, ...]:
    from pytest_afd.backends.cpu.pcp_builders import BUILDER_KINDS

    return BUILDER_KINDS


def head_piece(scheduled, computed, pcp: int) -> tuple[int | None, int]:
    """(cut request, the head piece's tokens) of the hook's PCP plan for the batch."""
    plan = _plan(scheduled, computed, pcp)
    return plan.boundary_request, int(stage_tokens(plan, computed)[0].num_scheduled_tokens[-1])


def full_batch_problems(scheduled, computed, pcp: int, kind: str) -> list[str]:
    """Every rank's full-batch changes across the stage builds of the hook's PCP plan."""
    from pytest_afd.backends.cpu.pcp import PcpEmulation
    from pytest_afd.backends.cpu.pcp_builders import full_batch_problems as problems

    plan = _plan(scheduled, computed, pcp)
    metadata = BatchMetadata.from_requests(list(scheduled), list(computed),
                                           block_size=BLOCK_SIZE)
    emulation = PcpEmulation(plan, metadata, kind)
    emulation.kernel_metadata(metadata, chunked_prefill=True)
    if len(emulation.rank_builds) != pcp:
        return [f"{len(emulation.rank_builds)} ranks built the full batch, not {pcp}"]
    return problems(emulation, metadata)


def _plan(scheduled, computed, pcp: int):
    return plan_pcp_step(np.asarray(scheduled), np.asarray(computed),
                         EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=pcp))
