"""The study sequence as a person runs it, one process per step (docs/stages.md, "The study
sequence"): shared by the end-to-end tests on the CPU backend and through the CPU deploy
command, so both run the same commands and differ only in the backend's environment and
the gate phases.

Every step is ``pytest-afd study ...`` (``python -m pytest_afd.cli study``) or ``python -m
pytest -m MARKER suites --afd-study FILE``, in its own process, at the CPU stage scale.
The reference criterion is loosened (``RELAXED``): on a shared CPU host repetition spreads
are 10-80 % (docs/study.md), so the RFC-grade defaults would reject every case and the later
stages would rightly refuse to run. The sequence is checked, not the host's stability; the
criterion has known-answer tests in test_study_references.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_afd.study.bundle_check import bundle_problems
from tests.support.inner_pytest import UNRELATED_PLUGINS

REPO = Path(__file__).resolve().parents[2]
SCALE = "1/64"  # the CPU backend's stage scale (suites/stage_sizes.py), as the rehearsal runs it
DEVICES_PER_NODE = "16"  # dp3pcp8-ep8: 32 devices, two nodes
NODES = ("10.0.0.1", "10.0.0.2")  # addresses written into the frozen launch commands only
RELAXED = ("--max-cv", "100", "--max-session-difference", "100")
STEP_TIMEOUT_S = 3 * 3600  # a hang guard, not a bound on how long a step may take
LAUNCH_PLAN = ("import sys; from pytest_afd.backends.vllm_ascend.launch import main; "
               "sys.exit(main(sys.argv[1:]))")  # the afd-launch-plan entry point
STUDY = ("-m", "pytest_afd.cli", "study")  # `pytest-afd study` where the script is not on PATH
STAGE_A = "stage_a and not slow"
STAGES_B_E = "stage_b or stage_c or stage_d or stage_e"


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without any AFD_ setting, at the CPU stage scale, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AFD_")}
    env.update({"PYTHONPATH": str(REPO), "AFD_STAGE_SCALE": SCALE,
                "AFD_DEVICES_PER_NODE": DEVICES_PER_NODE, "AFD_WARMUPS": "0", "AFD_REPEATS": "3",
                "AFD_GOLDEN_DIR": str(tmp_path / "golden"), **extra})
    return env


def results(directory: Path) -> list[dict]:
    """Every afd-result document under ``directory`` (at least one)."""
    docs = []
    for path in sorted(directory.rglob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "afd-result":
            docs.append(doc)
    assert docs, f"no result in {directory}"
    return docs


@dataclass
class StudyRun:
    """Where one run of the sequence wrote its files (each a path under ``tmp_path``)."""

    tmp_path: Path
    env: Mapping[str, str]
    gate_steps: Sequence[tuple[str, tuple[str, ...]]] = (("gates", ()),)
    """(results directory name, extra pytest flags) per gate session: one live session on
    the CPU backend; the record and check phases through a deploy command."""
    steps: list[str] = field(default_factory=list)

    def path(self, name: str) -> Path:
        return self.tmp_path / name

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *argv], cwd=REPO, env=dict(self.env), text=True,
                              capture_output=True, timeout=STEP_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-4000:]}\n" \
                                     f"{done.stderr[-4000:]}"
        self.steps.append(" ".join(argv))
        return done

    def pytest(self, marker: str, name: str, study: str, *extra: str) -> Path:
        directory = self.path(name)
        self.run("-m", "pytest", "-q", "-p", "no:cacheprovider", *UNRELATED_PLUGINS, "-m",
                 marker, "suites", "--afd-results-dir", str(directory), "--afd-study",
                 str(self.path(study)), *extra)
        return directory

    def study(self, *argv: str) -> subprocess.CompletedProcess:
        return self.run(*STUDY, *argv)

    def launch_plans(self) -> list[str]:
        flags = []
        for topology in ("dp3pcp8-ep8", "dp4pcp8"):
            done = self.run("-c", LAUNCH_PLAN, "--npu-topology", topology, "--model",
                            "/models/DeepSeek-V3.2-W8A8", "--devices-per-node", DEVICES_PER_NODE,
                            *(f"--node-address={a}" for a in NODES), "--nic-name", "eth0",
                            "--split", "token_balanced" if "ep" in topology else "none", "--json")
            plan = self.path(f"plan-{topology}.json")
            plan.write_text(done.stdout)
            flags.append(f"--launch-plan={plan}")
        return flags

    # The sequence, step by step (each returns what the next needs).

    def freeze(self, name: str) -> dict:
        self.study("freeze", "--name", name, "--output", str(self.path("study.json")),
                   "--npu-topology", "dp3pcp8-ep8", "--devices-per-node", DEVICES_PER_NODE,
                   "--checkpoint", "full", "--layers", "61", "--reduced-checkpoint", "reduced",
                   "--reduced-layers", "10", "--pp-reference", "pp4pcp8", "--warmups", "0",
                   "--stage-scale", str(1 / 64), *self.launch_plans())
        self.study("verify", str(self.path("study.json")))
        return json.loads(self.path("study.json").read_text())

    def gates(self) -> list[Path]:
        return [self.pytest("gate", name, "study.json", *extra) for name, extra in self.gate_steps]

    def stage_a(self) -> list[Path]:
        """Two sessions: the between-session criterion applies."""
        return [self.pytest(STAGE_A, name, "study.json") for name in ("stage-a-1", "stage-a-2")]

    def select(self, inputs: Sequence[Path], study: str, output: str) -> dict:
        self.study("select-references", *map(str, inputs), "--study", str(self.path(study)),
                   "--output", str(self.path(output)), *RELAXED)
        return json.loads(self.path(output).read_text())

    def publish(self, inputs: Sequence[Path], study: str) -> Path:
        bundle = self.path("bundle")
        self.study("publish", *map(str, inputs), "--study", str(self.path(study)), "--output",
                   str(bundle))
        return bundle

    def whole(self, name: str) -> dict:
        """Freeze, gates, Stage A twice, references, B-E, references again (Stage D's best
        two), Stage D again, Stage F, publish: the files of each step, by name."""
        frozen = self.freeze(name)
        gates = self.gates()
        stage_a = self.stage_a()
        referenced = self.select(stage_a, "study.json", "study-refs.json")
        later = self.pytest(STAGES_B_E, "stages-b-e", "study-refs.json")
        chunked = self.select([*stage_a, later], "study-refs.json", "study-chunks.json")
        again = self.pytest("stage_d", "stage-d-again", "study-chunks.json")
        stage_f = self.pytest("stage_f", "stage-f", "study-chunks.json")
        every = [*gates, *stage_a, later, again, stage_f]
        return {"frozen": frozen, "referenced": referenced, "chunked": chunked, "gates": gates,
                "stage_a": stage_a, "later": later, "again": again, "stage_f": stage_f,
                "every": every, "bundle": self.publish(every, "study-chunks.json")}


# -- checks on what the sequence wrote (both end-to-end tests) ----------------------------------
STAGE_SCALE = 1 / 64
"""``SCALE`` as a fraction: Stage D's frozen sizes at the stage scale."""


def check_references(run: dict) -> dict:
    """The referenced study derives from the frozen one, over two sessions, with a reference."""
    child = run["referenced"]
    references = child["references"]
    assert child["parent_digest"] == run["frozen"]["digest"] and len(references["sessions"]) == 2
    assert references["reference"]["workload"] is not None and references["selected"]
    return references["reference"]


def check_stages_b_e(run: dict) -> None:
    """Every B-E case records the referenced study; the swept ones ran its reference."""
    reference = check_references(run)
    later = results(run["later"])
    for doc in later:
        assert doc["manifest"]["study"]["digest"] == run["referenced"]["digest"], doc["case_id"]
        used = doc["evidence"].get("study_reference")
        # Stage D's follow-ups vary the workload on purpose (balanced, imbalanced).
        swept = doc["case_kind"] in ("stage_b", "stage_e") or "/sweep/" in doc["case_id"]
        if swept and used is not None:
            assert doc["workload"]["spec"]["distribution"] == reference["workload"], doc["case_id"]
            assert doc["settings"]["split_policy"] in (reference["policy"],
                                                       reference["control_policy"])
    kinds = {doc["case_kind"] for doc in later if "study_reference" in doc["evidence"]}
    assert kinds == {"stage_b", "stage_c", "stage_d", "stage_e"}


def check_stage_d_sizes(run: dict) -> None:
    """Stage D's follow-ups ran the best two sizes frozen into the study (at the stage scale)."""
    sizes = run["chunked"]["references"]["chunks"]["logical_chunk_sizes"]
    follow_ups = [d for d in results(run["again"]) if "/best/" in d["case_id"]]
    assert follow_ups and all(d["evidence"]["stage_d_best_sizes_source"].startswith("the study")
                              for d in follow_ups)
    assert follow_ups[0]["evidence"]["stage_d_best_sizes"] == [round(s * STAGE_SCALE) for s in sizes]


def check_bundle(run: dict) -> dict:
    """Every result records a study; the bundle agrees with itself and is diagnostic only."""
    for directory in run["every"]:
        assert all("study" in doc["manifest"] for doc in results(directory)), directory
    bundle: Path = run["bundle"]
    assert (bundle / "regions.json").is_file() and (bundle / "study.html").is_file()
    assert bundle_problems(bundle) == []  # schema, checksums, regions vs own tables, first line
    regions = json.loads((bundle / "regions.json").read_text())
    assert regions["production_recommendation"] is False  # CPU, reduced layers: diagnostic
    return regions
