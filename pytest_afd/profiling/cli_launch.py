"""``afd-launch-plan --profile``: the plugin profiler's variables on every AFD process."""

from __future__ import annotations

import argparse

from pytest_afd.profiling.schedule import ENV_TRACE_DIRS, apply_to_plan, schedule_for

DEFAULT_TRACE_ROOT = "/tmp/profile"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("profiling (docs/profiling.md)")
    group.add_argument("--profile", action="store_true",
                       help="switch the AFD plugin's profiler on for Attention and FFN "
                            "(AFD_NPU_{ATTENTION,FFN}_PROFILER_*)")
    group.add_argument("--profile-dir", default=DEFAULT_TRACE_ROOT,
                       help=f"traces go to DIR/attention and DIR/ffn; give the harness "
                            f"{ENV_TRACE_DIRS}=attention=DIR/attention,ffn=DIR/ffn")
    group.add_argument("--profile-skip-first", type=int, default=0,
                       help="engine steps the deployment runs before the case's warm-ups")
    group.add_argument("--profile-warmup-steps", type=int, default=1,
                       help="engine steps of the case's warm-ups")
    group.add_argument("--profile-steps", type=int, default=1,
                       help="engine steps of the case's measured (instrumented) repetitions")


def profiled_plan(plan, args: argparse.Namespace, error_type: type[Exception]):
    """``plan`` unchanged without --profile, else with the computed schedule on both roles."""
    if not args.profile:
        return plan
    try:
        schedule = schedule_for(prior_steps=args.profile_skip_first,
                                warmup_steps=args.profile_warmup_steps,
                                measured_steps=args.profile_steps)
    except ValueError as error:
        raise error_type(f"--profile: {error}") from error
    return apply_to_plan(plan, schedule, args.profile_dir)
