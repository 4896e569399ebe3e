"""``afd-split`` / ``python -m afd_split``: inspect the split of a production batch.

    python -m afd_split plan --tokens 4096,120,7000 --computed 0,0,512 \
        --policy token_balanced --align 8 [--pcp 2] [--padded-total N] --json

Bad input prints one line on stderr and exits with status 2. The report holds
request-level fields only (O(requests), whatever the token counts), plus the
block-table columns each ubatch spans under ``--block-size``.
"""

from __future__ import annotations

import argparse
import json
import sys

from afd_split.checks.metadata import DEFAULT_BLOCK_SIZE
from afd_split.checks.requests import RequestFields, split_request_fields, validate_split_requests
from afd_split.plan.constraints import SplitConstraints, SplitPolicy, checked_int
from afd_split.plan.planner import SplitPlan, as_token_counts, plan_split

EXIT_BAD_INPUT = 2
"""Same status argparse uses for usage errors."""
PROG = "afd-split"
"""The old console script's name; ``pytest-afd split`` passes its own."""
DESCRIPTION = "Inspect the split of a production batch: one line on stderr and status 2 on bad input."


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage block), for scripts and logs."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _int_list(text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=prog, description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser,
                                     help="what to do")
    plan = commands.add_parser("plan", help="plan a split and print per-ubatch metadata")
    plan.add_argument(
        "--tokens", type=_int_list, required=True, help="scheduled tokens per request"
    )
    plan.add_argument("--computed", type=_int_list, help="computed (cached) tokens per request")
    plan.add_argument(
        "--policy", choices=[policy.value for policy in SplitPolicy], default="token_balanced",
        help="where to cut (default: %(default)s)",
    )
    plan.add_argument("--align", type=int, default=1, help="SP/TP alignment unit of the cut")
    plan.add_argument("--pcp", type=int, default=1, help="prefill context parallel size")
    plan.add_argument("--padded-total", type=int, help="rows after DP/graph padding")
    plan.add_argument("--min-ubatch-tokens", type=int, default=1,
                      help="fewest real tokens a ubatch may hold (default: %(default)s)")
    plan.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                      help="KV cache block size, for max_blocks (default: %(default)s)")
    plan.add_argument(
        "--allow-fallback", action="store_true", help="run unsplit instead of rejecting"
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def plan_report(plan: SplitPlan, fields: RequestFields, block_size: int) -> dict:
    """The plan's evidence plus each ubatch's request-level fields, as plain JSON.

    Only request-indexed fields are derived (O(R)), so a request of 2**31 tokens
    is reported without building per-token arrays.
    """
    report = plan.to_evidence()
    parts = split_request_fields(plan, fields)
    validate_split_requests(plan, fields, parts)
    for entry, part in zip(report["ubatches"], parts, strict=True):
        query_lens = part.query_start_loc[1:] - part.query_start_loc[:-1]
        entry["query_start_loc"] = part.query_start_loc.tolist()
        entry["seq_lens"] = part.seq_lens.tolist()
        entry["num_computed_tokens"] = part.num_computed_tokens.tolist()
        entry["max_query_len"] = int(query_lens.max())
        entry["max_seq_len"] = int(part.seq_lens.max())
        # Block-table columns this ubatch's longest sequence spans.
        entry["max_blocks"] = -(-entry["max_seq_len"] // block_size)
    return report


def _format_table(report: dict) -> str:
    lines = [
        f"policy={report['policy']} split_token={report['split_token']} "
        f"boundary_request={report['boundary_request']} imbalance={report['imbalance']}"
    ]
    if report["fallback_reason"]:
        lines.append(f"fallback: {report['fallback_reason']}")
    for entry in report["ubatches"]:
        lines.append(
            f"ubatch {entry['index']}: tokens [{entry['token_start']}, {entry['token_stop']}) "
            f"requests [{entry['request_start']}, {entry['request_stop']}) "
            f"real={entry['num_real_tokens']} padded={entry['num_padded_tokens']} "
            f"seq_lens={entry['seq_lens']} computed={entry['num_computed_tokens']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Entry point of ``pytest-afd split`` (``prog``) and the old ``afd-split`` script."""
    parser = _build_parser(prog)
    args = parser.parse_args(argv)
    try:
        if args.computed is not None and len(args.computed) != len(args.tokens):
            raise ValueError(
                f"--computed has {len(args.computed)} entries but --tokens has {len(args.tokens)}"
            )
        as_token_counts(args.tokens, name="--tokens", minimum=1)
        if args.align > sum(args.tokens):
            # Any policy: an SP unit wider than the whole batch means mis-typed input.
            raise ValueError(
                f"--align={args.align} is larger than the batch's {sum(args.tokens)} tokens"
            )
        constraints = SplitConstraints(
            align=args.align,
            padded_total=args.padded_total,
            min_ubatch_tokens=args.min_ubatch_tokens,
            pcp_size=args.pcp,
        )
        plan = plan_split(
            args.tokens,
            policy=args.policy,
            constraints=constraints,
            allow_fallback=args.allow_fallback,
            num_computed_tokens=args.computed,
        )
        fields = RequestFields.from_requests(args.tokens, args.computed)
        block_size = checked_int("--block-size", args.block_size, 1)
    except ValueError as error:
        parser.exit(EXIT_BAD_INPUT, f"{parser.prog}: error: {error}\n")
    report = plan_report(plan, fields, block_size)
    print(json.dumps(report, indent=2) if args.json else _format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
