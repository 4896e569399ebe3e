"""Gate 1: a PCP token split never leaks into the full batch the dense layers run on.

On every emulated PCP rank (``pytest_afd.backends.cpu.pcp.PcpEmulation``) the full
batch is built with builder 0 and the stages with ``get_metadata_builder(ubid or
0)``, through stand-ins of the pinned SFA-CP and MLA-CP builders and the PCP
manager's padded-slot buffer, which keep persistent buffers and return views as
vllm-ascend v0.19.1rc1 does, inside the hook's own guard
(``afd_split.hook.glue.builder_state``). For cuts whose head piece is
not a multiple of 2 * pcp (afd-plugin issue cases: 8, 8, 3 and 1 real tokens per
rank lost their KV slot before the guard), the full batch's slot mapping,
positions and PCP metadata must be bit-identical before and after the stage
builds, and (SFA-CP) its real tokens' slots must be the batch's own. Metadata
only: it runs on every topology of the CPU backend, at PCP 2 and 8.
"""

from __future__ import annotations

import pytest
from gate_lib import CPU_BACKEND

from pytest_afd.run.pcp_full_batch import builder_kinds, full_batch_problems, head_piece

CASES = {
    "1000x2": ([1000, 1000], [0, 256], (8,)),
    "five": ([700, 300, 1500, 400, 96], [128, 2048, 512, 0, 1664], (8,)),
    "decodes": ([1, 1, 1, 1800, 1, 1, 400], [50, 70, 90, 0, 30, 20, 0], (2, 8)),
    "one_token_tail": ([151, 106, 255], [93, 21, 91], (2, 8)),
}
"""(scheduled, computed, PCP sizes): each cut inside a request, the head piece not a
multiple of 2 * pcp."""


@pytest.fixture
def cpu_backend_only(afd_options):
    if afd_options.backend != CPU_BACKEND:
        pytest.skip("the full-batch check runs the CPU backend's PCP emulation")


@pytest.mark.gate
@pytest.mark.parametrize("kind", builder_kinds())
@pytest.mark.parametrize("case", sorted(CASES))
def test_gate_1_stage_builds_keep_the_full_batch(cpu_backend_only, case, kind):
    scheduled, computed, pcps = CASES[case]
    for pcp in pcps:
        cut, head = head_piece(scheduled, computed, pcp)
        assert cut is not None and head % (2 * pcp), (case, pcp, head)
        problems = full_batch_problems(scheduled, computed, pcp, kind)
        assert problems == [], f"{case} at PCP {pcp} ({kind}): " + "; ".join(problems)
