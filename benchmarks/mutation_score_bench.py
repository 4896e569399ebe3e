"""Mutation score of afd_split's core: a sampled, bounded mutmut run (issue 40, finding 8).

mutmut (pinned in the ``test`` extra; configured in pyproject.toml ``[tool.mutmut]``)
mutates afd_split's plan, checks, pcp and engine slicing modules and runs the fast
afd_split unit tests against each mutant. This script:

1. generates every mutant (mutmut's own generator, no test run);
2. draws a seeded sample of ``--sample`` mutants among those whose module matches
   ``--module`` (a glob of dotted names; default: all of them);
3. runs ``mutmut run`` on exactly that sample (``--max-children`` workers);
4. reads each sampled mutant's result and scores it, counting the survivors listed
   with their reasons in ``tests/afd_split/mutation_equivalents.toml`` as equivalent
   (excluded from the score), and writes JSON (``--output``) with a ``met`` flag:
   killed / non-equivalent >= 0.9.

Mutants mutmut could not judge (no test covers the function, timeouts, suspicious) are
counted apart and never as killed. The one-line summary goes to stdout.

Usage: python3 benchmarks/mutation_score_bench.py [--module 'afd_split.plan.*'] [--sample 40]
       [--seed 0] [--max-children 1] [--output mutation-score.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the nightly runs 3.11
    tomllib = None

REPO = Path(__file__).resolve().parents[1]
EQUIVALENTS = REPO / "tests" / "afd_split" / "mutation_equivalents.toml"
TARGET_SCORE = 0.9
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile (a two-sided 95% interval)
KILLED_CODES = frozenset({1, 3})
SURVIVED_CODE = 0
NOT_RUN = None
_GENERATE = (
    "from mutmut.mutation.trampoline import set_mutant_under_test\n"
    "from mutmut.utils.file_utils import copy_src_dir, copy_also_copy_files, setup_source_paths\n"
    "from mutmut.__main__ import create_mutants\n"
    "set_mutant_under_test('mutant_generation')\n"
    "copy_src_dir(); copy_also_copy_files(); setup_source_paths()\n"
    "stats = create_mutants(1)\n"
    "print(stats.mutated, stats.ignored, stats.unmodified)\n"
)


def meta_files(root: Path) -> list[Path]:
    return sorted((root / "mutants").rglob("*.py.meta"))


def mutant_results(root: Path) -> dict[str, int | None]:
    """Mutant name -> mutmut's exit code (None: not run yet), over every generated file."""
    results: dict[str, int | None] = {}
    for path in meta_files(root):
        results.update(json.loads(path.read_text())["exit_code_by_key"])
    return results


def module_of(mutant: str) -> str:
    """``afd_split.plan.constraints.x_round_up__mutmut_3`` -> ``afd_split.plan.constraints``."""
    return mutant.split("__mutmut_")[0].rsplit(".", 1)[0]


def load_equivalents(path: Path) -> dict[str, str]:
    """Mutant name -> the reason it is equivalent (a malformed entry is named)."""
    if not path.is_file():
        return {}
    if tomllib is None:
        raise ValueError(f"{path}: reading it needs Python >= 3.11 (tomllib)")
    doc = tomllib.loads(path.read_text())
    found = {}
    for index, entry in enumerate(doc.get("equivalent", [])):
        if not isinstance(entry.get("mutant"), str) or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path}: equivalent[{index}] needs a mutant name and a reason")
        found[entry["mutant"]] = entry["reason"]
    return found


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion (None for no trials).

    Why Wilson and not ``p +- z*sqrt(p(1-p)/n)``: near 90% with a few dozen mutants the
    plain interval runs past 1 and is too narrow; Wilson's stays in [0, 1] and keeps close
    to its nominal coverage. The sample is a draw without replacement from thousands of
    mutants, so the binomial is a slight over-statement of the spread (no finite-population
    correction)."""
    if trials <= 0:
        return None
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def score(sample: list[str], results: dict[str, int | None],
          equivalents: dict[str, str]) -> dict:
    """Killed / survived / equivalent / not judged among ``sample``, and the score."""
    killed = [m for m in sample if results.get(m) in KILLED_CODES]
    survived = [m for m in sample if results.get(m) == SURVIVED_CODE]
    equivalent = [m for m in survived if m in equivalents]
    live = [m for m in survived if m not in equivalents]
    unjudged = {m: results.get(m) for m in sample if m not in killed and m not in survived}
    judged = len(killed) + len(live)
    value = len(killed) / judged if judged else None
    return {
        "sampled": len(sample),
        "killed": len(killed),
        "survived_non_equivalent": len(live),
        "survived_equivalent": len(equivalent),
        "not_judged": len(unjudged),
        "not_judged_exit_codes": unjudged,
        "score": value,
        "score_95_interval": wilson_interval(len(killed), judged),
        "score_interval_method": "Wilson score interval, binomial, 95%",
        "score_absent_reason": None if judged else "no sampled mutant was judged",
        "target": TARGET_SCORE,
        "met": value is not None and value >= TARGET_SCORE,
        "survivors": live,
        "equivalent_survivors": {m: equivalents[m] for m in equivalent},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="afd_split.*",
                        help="glob of the dotted module names to sample from")
    parser.add_argument("--sample", type=int, default=40, help="mutants to run (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--output", type=Path, default=REPO / "mutation-score.json")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    parser.add_argument("--require-met", action="store_true",
                        help="exit 1 when the score is below the target (not only report it)")
    args = parser.parse_args(argv)
    if args.sample < 0:
        parser.error(f"--sample {args.sample}: expected a count >= 0")
    equivalents = load_equivalents(args.equivalents)
    started = time.time()
    subprocess.run([sys.executable, "-c", _GENERATE], cwd=REPO, check=True)
    everything = sorted(m for m in mutant_results(REPO)
                        if fnmatch.fnmatch(module_of(m), args.module))
    if not everything:
        print(f"mutation_score: no mutant of a module matching {args.module!r}", file=sys.stderr)
        return 2
    sample = everything if args.sample == 0 or args.sample >= len(everything) else \
        sorted(random.Random(args.seed).sample(everything, args.sample))
    run = subprocess.run(["mutmut", "run", "--max-children", str(args.max_children), *sample],
                         cwd=REPO, check=False)
    doc = {
        "benchmark": "mutation_score",
        "tool": "mutmut",
        "module_glob": args.module,
        "mutants_generated": len(everything),
        "seed": args.seed,
        "mutmut_exit_status": run.returncode,
        **score(sample, mutant_results(REPO), equivalents),
        "wall_s": round(time.time() - started, 1),
        "uptime_load_1min": float(Path("/proc/loadavg").read_text().split()[0])
        if Path("/proc/loadavg").is_file() else None,
    }
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    value = "n/a" if doc["score"] is None else (
        f"{doc['score']:.1%} (95% {doc['score_95_interval'][0]:.1%}-"
        f"{doc['score_95_interval'][1]:.1%})")
    print(f"mutation score {value} ({doc['killed']} killed, {doc['survived_non_equivalent']} "
          f"survived, {doc['survived_equivalent']} equivalent, {doc['not_judged']} not judged "
          f"of {doc['sampled']} sampled from {len(everything)} in {args.module}); target "
          f">= {TARGET_SCORE:.0%}: met={doc['met']}; {args.output}")
    if run.returncode != 0 or (args.require_met and not doc["met"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
