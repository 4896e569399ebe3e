"""The row alignment each split stage needs from the engine's TP / SP / PCP path.

Facts from vllm-ascend v0.19.1rc1 (commit da421afad719,
``vllm_ascend/worker/model_runner_v1.py``): ``_pad_for_sequence_parallelism``
rounds the step's token count up to a multiple of ``tensor_parallel_size``
when sequence parallelism is on (``enable_sp`` or ``enable_sp_by_pass``) and
leaves it alone otherwise; under PCP the count it pads is the rank-local one
(``execute_model`` passes ``pcp_manager.total_num_sampled_tokens_pcp``), and
``PCPManager.update_tokens_for_pcp`` pads every request to a multiple of
2 * pcp, so a rank holds (global rows) / pcp rows. A stage must meet the same
rule on its own (its SP collectives scatter its rows over the TP ranks), so:

* SP alone: stage rows a multiple of tp;
* PCP alone: each request piece padded to 2 * pcp (the planner's PCP rows);
* both: rank-local rows a multiple of tp, i.e. global rows a multiple of
  lcm(2 * pcp, tp * pcp).

The cut itself falls on a multiple of the unit and padding goes to the last
stage only (the parent's own padding rows), so the head carries no padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from afd_split.errors import UnsupportedSplitError
from afd_split.plan.constraints import (
    MIN_PCP_FOR_ZIGZAG,
    ZIGZAG_CHUNKS_PER_RANK,
    SplitConstraints,
)

SP_PADDING_RULE = "vllm-ascend v0.19.1rc1 da421afad719 model_runner_v1._pad_for_sequence_parallelism"


@dataclass(frozen=True)
class EngineAlignment:
    """The parallel layout a stage must fit: TP size, SP on/off, PCP size."""

    tp_size: int
    sequence_parallel: bool
    pcp_size: int = 1

    @property
    def pcp_enabled(self) -> bool:
        return self.pcp_size >= MIN_PCP_FOR_ZIGZAG

    @property
    def rank_local_unit(self) -> int:
        """What ``_pad_for_sequence_parallelism`` rounds a rank's rows to (1 without SP)."""
        return self.tp_size if self.sequence_parallel else 1

    @property
    def row_unit(self) -> int:
        """Global rows every stage (and the cut) is a multiple of."""
        if not self.pcp_enabled:
            return self.rank_local_unit
        return math.lcm(ZIGZAG_CHUNKS_PER_RANK * self.pcp_size,
                        self.rank_local_unit * self.pcp_size)

    def describe(self) -> str:
        parts = [f"tp={self.tp_size} SP {'on' if self.sequence_parallel else 'off'}"]
        if self.pcp_enabled:
            parts.append(f"pcp={self.pcp_size} (2*pcp per request piece)")
        return f"{', '.join(parts)}: stage rows a multiple of {self.row_unit}"

    def constraints(self, num_input_tokens: int | None) -> SplitConstraints:
        """The step's split constraints; ``num_input_tokens`` is the parent's padded rows
        (its last stage carries the padding). Under PCP the stages are laid out afresh,
        so the parent's rank-local padded count is not a bound on them.

        ``UnsupportedSplitError`` names the rule when the parent does not meet it:
        such a parent cannot be cut into aligned stages.
        """
        unit = self.row_unit
        if self.pcp_enabled or unit == 1:
            return SplitConstraints(align=unit, pcp_size=self.pcp_size)
        if num_input_tokens is None or num_input_tokens % unit:
            raise UnsupportedSplitError(
                f"parent num_input_tokens={num_input_tokens} is not a multiple of the stage "
                f"alignment {unit} ({self.describe()}; {SP_PADDING_RULE}); it cannot be "
                "split into aligned stages"
            )
        return SplitConstraints(align=unit, padded_total=num_input_tokens)


def stage_rank_rows(num_rows: int, pcp_size: int) -> int:
    """A stage's rows on one rank: its global rows over the PCP ranks."""
    ranks = pcp_size if pcp_size >= MIN_PCP_FOR_ZIGZAG else 1
    if num_rows % ranks:
        raise UnsupportedSplitError(f"stage of {num_rows} rows does not divide over pcp={ranks}")
    return num_rows // ranks
