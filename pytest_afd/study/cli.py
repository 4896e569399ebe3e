"""``pytest-afd study COMMAND``: freeze, verify, select-references, publish.

- ``freeze --name N --output FILE [...]``: write a frozen study (docs/study.md).
- ``verify FILE [--manifest RESULT_OR_MANIFEST...]``: check the schema and the
  digest (a hand edit fails), and list where each given run contradicts it.
- ``select-references STAGE_A_RESULTS... --study FILE --output NEWFILE``: the
  stable reference cases of Stage A into a new study (parent_digest set).
- ``publish ...``: the bundle (``pytest_afd.study.publish``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

USAGE_ERROR = 2
CONTRADICTED = 1


def _add_freeze(commands: argparse._SubParsersAction) -> None:
    from pytest_afd.study import freeze

    parser = commands.add_parser(
        "freeze", help="write a frozen study: stack, topology, launch commands, tolerances",
        description="Write the RFC's step-1 freeze list as a study JSON with its digest. "
        "Flags override --from-manifest, which overrides --from-study; a stack field none of "
        "them gives is recorded absent with the reason.")
    freeze.add_arguments(parser)


def _freeze(args: argparse.Namespace) -> int:
    from pytest_afd.study.document import StudyError, write_study
    from pytest_afd.study.freeze import build_study

    try:
        study = build_study(args)
        path = write_study(study, args.output)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(f"{path}: study {study['name']!r} {study['digest']}")
    return 0


def _add_verify(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "verify", help="check a study's schema and digest (and runs against it)",
        description="Exit 0 when FILE is a schema-valid study whose digest matches its content; "
        "2 when not (a hand-edited study). With --manifest, also exit 1 when a run contradicts it.")
    parser.add_argument("study", help="the study JSON")
    parser.add_argument("--manifest", action="append", default=[], metavar="FILE",
                        help="a result or manifest JSON to check against the study (repeat)")


def _verify(args: argparse.Namespace) -> int:
    from pytest_afd.study.check import contradiction_message, contradictions, load_study
    from pytest_afd.study.document import StudyError
    from pytest_afd.study.freeze import read_manifest

    try:
        study = load_study(args.study)
        manifests = [(path, read_manifest(path)) for path in args.manifest]
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(f"{args.study}: study {study['name']!r} {study['digest']} (digest verified)")
    status = 0
    for path, manifest in manifests:
        found = contradictions(study, manifest)
        print(f"{path}: " + (contradiction_message(study, found) if found else "consistent"))
        status = CONTRADICTED if found else status
    return status


def _add_select_references(commands: argparse._SubParsersAction) -> None:
    from pytest_afd.study import references

    parser = commands.add_parser(
        "select-references", help="Stage A results -> the study's stable reference cases",
        description=references.DESCRIPTION)
    references.add_arguments(parser)


def _select_references(args: argparse.Namespace) -> int:
    from pytest_afd.study import references

    return references.main(args)


def _add_publish(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "publish", add_help=False, help="write the study's bundle (regions, tables, limitations)",
        description="See 'study publish --help'.")


COMMANDS: dict[str, tuple[Callable, Callable[[argparse.Namespace], int]]] = {
    "freeze": (_add_freeze, _freeze),
    "verify": (_add_verify, _verify),
    "select-references": (_add_select_references, _select_references),
}


def main(argv: list[str] | None = None, prog: str = "pytest-afd study") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["publish"]:
        from pytest_afd.study import publish  # lazy: its own dependencies

        return publish.main(argv[1:], prog=prog + " publish")
    parser = argparse.ArgumentParser(
        prog=prog, description="The RFC's study: freeze, verify, select-references, publish "
        "(docs/study.md).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="the study step to run")
    for add, _ in COMMANDS.values():
        add(commands)
    _add_publish(commands)
    args = parser.parse_args(argv)
    return COMMANDS[args.command][1](args)


if __name__ == "__main__":
    sys.exit(main())
