"""Boundary faults a sampled mutation run showed no test would catch (issue 40, finding 8).

Each test here fails on the mutant named in its docstring (docs/ci.md "Mutation testing"
lists how each was checked): comparisons moved by one at a request boundary, an explicit
PCP layout that is ignored or wrongly refused, M-RoPE ``[3, T]`` positions sliced on the
wrong axis once padding rows are added, and a padded total of a single token.
"""

from __future__ import annotations

import numpy as np
import pytest

from afd_split import SplitConstraints, plan_split
from afd_split.checks.metadata import BatchMetadata
from afd_split.checks.requests import split_request_arrays
from afd_split.pcp.stage import stage_tokens, zigzag_layout
from afd_split.pcp.stage_metadata import stage_metadata, stage_metadata_of_ranks

TB = "token_balanced"
PAD = -1


def request_arrays(counts):
    meta = BatchMetadata.from_requests(counts, [0] * len(counts))
    return meta.query_start_loc, meta.seq_lens, meta.num_computed_tokens


# --- A plan and a batch mismatched exactly at a request boundary ---------------------------


@pytest.mark.parametrize(("planned", "batch"), [
    # The plan's head ends at token 4 inside request 1; the batch's request 0 ends at 4:
    # the head's last request would hold no token of it (qsl[req_stop - 1] == token_stop).
    ([3, 5], [4, 4]),
    # The plan's tail starts at token 4 inside request 0; the batch's request 0 ends at 4:
    # the tail's first request would hold no token of it (token_start == qsl[req_start + 1]).
    ([5, 3], [4, 4]),
])
def test_a_batch_whose_request_boundary_sits_on_the_cut_is_refused(planned, batch):
    """Kills ``<`` -> ``<=`` on either inner bound of ``_check_placement``."""
    plan = plan_split(planned, policy=TB)
    assert [u.token_slice for u in plan.ubatches] == [slice(0, 4), slice(4, 8)]
    assert plan.num_tokens == sum(batch) and plan.num_requests == len(batch)
    with pytest.raises(ValueError, match="for a different batch"):
        split_request_arrays(plan, *request_arrays(batch))


@pytest.mark.parametrize("counts", [[4, 4], [3, 5], [5, 3], [1, 6, 1]])
def test_the_planned_batch_itself_passes_at_its_boundaries(counts):
    """Kills ``<=`` -> ``<`` on either outer bound (a ubatch starting or ending exactly on
    a request boundary of its own batch)."""
    plan = plan_split(counts, policy=TB)
    parts = split_request_arrays(plan, *request_arrays(counts))
    assert [int(qsl[-1]) for qsl, _, _ in parts] == [u.num_real_tokens for u in plan.ubatches]


# --- Stage metadata given an explicit layout= -----------------------------------------------


def pcp_stage(counts=(9, 30, 17), pcp_size=2):
    plan = plan_split(list(counts), policy=TB,
                      constraints=SplitConstraints(pcp_size=pcp_size, align=1))
    return stage_tokens(plan, [0] * len(counts))[1]


def as_lists(metadata):
    return {name: (value.tolist() if isinstance(value, np.ndarray) else
                   {k: v.tolist() for k, v in value.items()} if isinstance(value, dict) else value)
            for name, value in vars(metadata).items()}


@pytest.mark.parametrize("pcp_rank", [0, 1])
def test_an_explicit_layout_gives_the_metadata_the_stage_makes_itself(pcp_rank):
    """Kills a negated or dropped check of a *matching* layout (it would be refused)."""
    stage = pcp_stage()
    layout = zigzag_layout(stage.num_scheduled_tokens, 2)
    given = stage_metadata(stage, 2, pcp_rank, layout=layout)
    assert as_lists(given) == as_lists(stage_metadata(stage, 2, pcp_rank))


def test_a_layout_of_other_counts_is_refused_naming_both():
    """Kills ``layout=layout`` -> ``layout=None`` in ``stage_metadata`` and ``or`` -> ``and``."""
    stage = pcp_stage()
    other = zigzag_layout(np.asarray(stage.num_scheduled_tokens) + 1, 2)
    with pytest.raises(ValueError, match=r"layout of .* over 2 ranks given for a stage of"):
        stage_metadata(stage, 2, 0, layout=other)


def test_a_layout_of_another_pcp_size_is_refused():
    stage = pcp_stage(pcp_size=4)
    layout = zigzag_layout(stage.num_scheduled_tokens, 2)  # right counts, wrong size
    with pytest.raises(ValueError, match=r"over 2 ranks given for a stage of .* over 4"):
        stage_metadata_of_ranks(stage, 4, layout=layout)


# --- M-RoPE [3, T] positions with padding rows ----------------------------------------------


@pytest.mark.parametrize("constraints", [
    SplitConstraints(align=8),  # padding rows after the real ones (a prefix)
    SplitConstraints(align=1, pcp_size=2),  # per-piece PCP padding (index_copy)
], ids=["align", "pcp"])
def test_mrope_positions_keep_their_three_rows_with_padding(constraints):
    """Kills slicing the first axis (``tensor.ndim == 1`` negated) and a pad shape that
    drops the leading ``3``."""
    torch = pytest.importorskip("torch")
    from afd_split.engine.slicing import ubatch_token_rows

    counts = [13, 22]
    plan = plan_split(counts, policy=TB, constraints=constraints)
    total = sum(counts)
    positions = torch.arange(3 * total, dtype=torch.int64).reshape(3, total)
    assert plan.ubatches[-1].num_padded_tokens > 0
    for ubatch in plan.ubatches:
        rows = ubatch_token_rows(positions, ubatch, with_padding=True, pad_value=PAD)
        assert tuple(rows.shape) == (3, ubatch.num_rows)
        real = torch.tensor(ubatch.real_row_indices.tolist())
        assert torch.equal(rows[:, real], positions[:, ubatch.token_slice])
        pad = np.setdiff1d(np.arange(ubatch.num_rows), ubatch.real_row_indices)
        assert pad.size == ubatch.num_padded_tokens
        assert (rows[:, torch.as_tensor(pad)] == PAD).all()
        plain = ubatch_token_rows(positions, ubatch, with_padding=False, pad_value=PAD)
        assert torch.equal(plain, positions[:, ubatch.token_slice])


# --- A padded total of one token -------------------------------------------------------------


def test_a_padded_total_of_one_row_is_accepted_and_zero_is_refused():
    """Kills the minimum 1 -> 2 (or 0) and ``<`` -> ``<=`` in ``total_rows_for``."""
    one = SplitConstraints(padded_total=1)
    assert one.padded_total == 1
    assert one.total_rows_for(1) == 1
    with pytest.raises(ValueError, match=r"padded_total must be an integer >= 1, got 0"):
        SplitConstraints(padded_total=0)
    with pytest.raises(ValueError, match=r"padded_total=1 is below round_up\(T=2"):
        one.total_rows_for(2)


# --- A survivor of the sampled mutmut run (docs/ci.md) ---------------------------------------


def test_request_fields_name_the_counts_that_overflow_int64():
    """Kills ``RequestFields.from_requests__mutmut_16`` (the overflow names another field):
    counts past int64 are named as the caller's ``num_scheduled_tokens``."""
    from afd_split.checks.requests import RequestFields

    huge = np.iinfo(np.int64).max // 2 + 1
    with pytest.raises(ValueError, match=r"^num_scheduled_tokens add up to \d+ tokens, past"):
        RequestFields.from_requests([huge, huge])


def test_a_parent_whose_seq_lens_disagree_names_num_computed_tokens():
    """Kills ``_diagnose_parent__mutmut_65`` (the field left unnamed in the message)."""
    from afd_split import SplitInvariantError
    from afd_split.checks.diagnosis import diagnose_split

    counts = [4, 4]
    plan = plan_split(counts, policy=TB)
    qsl, seq_lens, computed = (np.array(a, dtype=np.int64) for a in request_arrays(counts))
    seq_lens[1] += 2  # seq - query != computed for request 1
    with pytest.raises(SplitInvariantError,
                       match=r"parent request 1: num_computed_tokens 0 != expected 2"):
        diagnose_split(plan, qsl, seq_lens, computed, [])


def test_the_first_token_beyond_the_block_table_is_named_in_a_later_request():
    """Kills ``name_token_violation__mutmut_47`` (``+`` -> ``-`` in the token named):
    request 1 starts at token 3; its position 8 (token 3 + 8 = 11) is block 2 of 2 columns."""
    from afd_split import SplitInvariantError
    from afd_split.checks.tokens import name_token_violation

    qsl = np.array([0, 3, 13])
    query_lens, computed = np.array([3, 10]), np.array([0, 0])
    seq_lens = computed + query_lens
    meta = BatchMetadata(qsl, seq_lens, computed, slot_mapping=[0, 1, 2, *range(8, 18)],
                         block_table=[[0, 1], [2, 3]], positions=[0, 1, 2, *range(10)],
                         block_size=4)
    with pytest.raises(SplitInvariantError,
                       match=r"^token 11: block 2 is beyond the block table's 2 columns"):
        name_token_violation(meta, qsl, query_lens, computed, seq_lens)


def test_a_cost_model_of_one_moe_layer_is_accepted_and_a_bad_coefficient_named():
    """Kills ``CostModel.__post_init__`` mutants 21 (minimum layers 1 -> 2) and 7 (the
    coefficient's name in the error)."""
    from afd_split.plan.cost import CostModel

    assert CostModel(1e-6, 1e-9, 1e-6, num_moe_layers=1).num_moe_layers == 1
    with pytest.raises(ValueError, match=r"^CostModel.num_moe_layers must be >= 1, got 0"):
        CostModel(1e-6, 1e-9, 1e-6, num_moe_layers=0)
    with pytest.raises(ValueError, match=r"^CostModel.expert_per_token_s must be a finite"):
        CostModel(1e-6, 1e-9, -1.0)


@pytest.mark.parametrize("name", ["attention_per_token_s", "attention_per_key_s",
                                  "expert_per_token_s", "attention_fixed_s", "expert_fixed_s",
                                  "transfer_per_token_s"])
def test_every_bad_cost_coefficient_is_named(name):
    """Kills the family of ``CostModel.__post_init__`` mutants that rename a coefficient."""
    from afd_split.plan.cost import CostModel

    values = {"attention_per_token_s": 1e-6, "attention_per_key_s": 1e-9,
              "expert_per_token_s": 1e-6, name: float("nan")}
    with pytest.raises(ValueError, match=rf"^CostModel\.{name} must be a finite number >= 0"):
        CostModel(**values)


def test_constraints_record_their_own_field_names():
    """Kills ``SplitConstraints.to_dict`` mutants that rename a key (evidence and plan
    fingerprints read these names)."""
    constraints = SplitConstraints(align=2, padded_total=8, min_ubatch_tokens=3, pcp_size=1)
    assert constraints.to_dict() == {"align": 2, "padded_total": 8, "min_ubatch_tokens": 3,
                                     "pcp_size": 1}


# --- Host prefix sums compared by value on both paths -----------------------------------------


@pytest.mark.parametrize("num_requests", [4, 20])  # the list path (<= 16) and the array path
def test_a_fractional_query_start_loc_is_refused_on_both_paths(num_requests):
    """A cast to int64 on the array path (> SCALAR_MAX_REQUESTS) read 2.5 as 2 and accepted a
    batch the list path refuses (mutation run survivor ``_same_prefix_sums`` 4)."""
    from afd_split.engine.slicing import SCALAR_MAX_REQUESTS, parent_host_arrays

    assert (num_requests > SCALAR_MAX_REQUESTS) == (num_requests == 20)
    counts = [2] * num_requests
    plan = plan_split(counts, policy=TB)
    qsl = np.arange(num_requests + 1, dtype=np.float64) * 2
    seq_lens = np.array(counts, dtype=np.int64)
    integral = parent_host_arrays(plan, qsl, seq_lens, None, source=lambda: "test")
    assert integral[0].tolist() == qsl.tolist()
    qsl[1] += 0.5
    with pytest.raises(ValueError, match="for a different batch"):
        parent_host_arrays(plan, qsl, seq_lens, None, source=lambda: "test")
