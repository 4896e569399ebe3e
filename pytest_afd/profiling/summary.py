"""``pytest-afd profile-summary DIR...``: profiles taken by hand -> the figures
(printed; ``--json`` prints the JSON instead), the same JSON and the report's per-layer
and overlap plots.

A DIR is ``ROLE=PATH`` or a bare PATH:

- ascend_pt: a role's directory holding ``*_ascend_pt`` rank trees (the plugin's
  ``AFD_NPU_<ROLE>_PROFILER_DIR``); a bare PATH takes its role from its name
  (``attn``/``attention`` or ``ffn``);
- torch traces: a CPU run's trace root (``attention/`` and ``ffn/`` of
  ``rank<i>/step<n>.pt.trace.json``, what ``AFD_PROFILE_KEEP_TRACES`` keeps).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_afd.profiling import schedule

PROFILE_JSON = "profile.json"
ROLE_ALIASES = {"attn": "attention", "attention": "attention", "ffn": "ffn"}
DESCRIPTION = """\
Profiles taken by hand -> profile.json and the report's per-layer and overlap plots.

A DIR is ROLE=PATH or a bare PATH:

- ascend_pt: a role's directory holding *_ascend_pt rank trees (the plugin's
  AFD_NPU_<ROLE>_PROFILER_DIR); a bare PATH takes its role from its name
  (attn/attention or ffn);
- torch traces: a CPU run's trace root (attention/ and ffn/ of
  rank<i>/step<n>.pt.trace.json, what AFD_PROFILE_KEEP_TRACES keeps).
"""


class SummaryError(ValueError):
    """A DIR argument that is not a profile directory (the message names it)."""


def _role_of(path: Path) -> str | None:
    for part in reversed(path.resolve().parts):
        if part.lower() in ROLE_ALIASES:
            return ROLE_ALIASES[part.lower()]
    return None


def _is_torch_root(path: Path) -> bool:
    return any((path / role).is_dir() and any((path / role).glob("rank*/step*.pt.trace.json"))
               for role in schedule.ROLES)


def classify_dirs(arguments: Sequence[str]) -> tuple[str, Any]:
    """("torch_trace", root) or ("ascend_pt", {role: path}) from the DIR arguments."""
    ascend: dict[str, Path] = {}
    torch_roots = []
    for argument in arguments:
        role, sep, text = argument.partition("=")
        path = Path(text if sep else argument)
        if not path.is_dir():
            raise SummaryError(f"profile-summary: {argument!r}: {str(path)!r} is not a directory")
        if not sep and _is_torch_root(path):
            torch_roots.append(path)
            continue
        if not any(path.rglob("*_ascend_pt")) and not path.name.endswith("_ascend_pt"):
            raise SummaryError(f"profile-summary: {argument!r}: no *_ascend_pt rank directory "
                               "and no attention/ or ffn/ torch traces under it")
        role = role if sep else _role_of(path)
        if role not in schedule.ROLES:
            raise SummaryError(f"profile-summary: {argument!r}: cannot tell the role; write "
                               f"attention={path} or ffn={path}")
        if role in ascend:
            raise SummaryError(f"profile-summary: {argument!r}: a second {role} directory")
        ascend[role] = path
    if (torch_roots and ascend) or len(torch_roots) > 1:
        raise SummaryError("profile-summary: give one torch trace root, or ascend_pt role "
                           "directories, not both")
    return ("torch_trace", torch_roots[0]) if torch_roots else ("ascend_pt", ascend)


def analyse_dirs(arguments: Sequence[str]) -> dict[str, Any]:
    kind, where = classify_dirs(arguments)
    if kind == "torch_trace":
        from pytest_afd.profiling import torch_trace

        return torch_trace.analyse(where)
    from pytest_afd.profiling import ascend

    return ascend.analyse(where)


def add_parser(commands: argparse._SubParsersAction) -> None:
    summary = commands.add_parser(
        "profile-summary",
        help="analyse profile directories taken by hand (ascend_pt or torch traces)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    summary.add_argument("dirs", nargs="+", metavar="DIR",
                         help="a profile directory: ROLE=PATH or PATH (see above)")
    summary.add_argument("--output", default="profile-summary",
                         help="directory for profile.json and plots/ (default %(default)s)")
    summary.add_argument("--no-plots", action="store_true", help="write the JSON only")
    summary.add_argument("--json", action="store_true",
                         help="print the profile JSON instead of the figures (machines)")


def run(args: argparse.Namespace) -> int:
    from pytest_afd.profiling.msprof import ProfilingUnavailable

    try:
        profile = analyse_dirs(args.dirs)
    except (SummaryError, ProfilingUnavailable, ValueError) as error:
        print(f"error: {error}", flush=True)
        return 2
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / PROFILE_JSON).write_text(json.dumps(profile, indent=1, sort_keys=True) + "\n")
    written = [output / PROFILE_JSON]
    if not args.no_plots:
        from pytest_afd.report.profile_plots import save_profile_plots

        written += save_profile_plots(profile, output / "plots")
    if args.json:
        print(json.dumps(profile, indent=1, sort_keys=True))
        return 0
    from pytest_afd.profiling.summary_text import render

    print(render(profile))
    print("\nWritten:")
    for path in written:
        print(f"  {path}")
    return 0
