"""--afd-study in a pytest session: the study recorded in every case, contradicting runs refused
before they measure (pytest_afd.run.study_plugin, docs/study.md)."""

import json

from pytest_afd.study import cli as study_cli
from tests.support.plugin_pytester import run_fast

pytest_plugins = ["pytester"]

USER = """
import pytest

@pytest.mark.stage_a
def test_case(record_case):
    record_case()
"""
PINNED_VLLM_ASCEND = "0.11.0rc1+git.0123abc"


def _results(project):
    return sorted((project.path / "afd-results").rglob("test_study*.json"))


def _freeze(project, name, *flags):
    """Freeze a study from the result of a first, study-less run of the same project."""
    run_fast(project).assert_outcomes(passed=1)
    (result,) = _results(project)
    path = project.path / f"{name}.json"
    assert study_cli.main(["freeze", "--name", name, "--output", str(path),
                           "--from-manifest", str(result), *flags]) == 0
    result.unlink()
    (project.path / "written.txt").unlink()  # the fake conftest's record of written results
    return path, json.loads(path.read_text())


def test_plugin_study_matching_run_passes_and_records_the_study(fake):
    fake.makepyfile(test_study=USER)
    path, study = _freeze(fake, "matching")
    result = run_fast(fake, "--afd-study", str(path))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"afd: study 'matching' {study['digest']}"])
    (written,) = _results(fake)
    doc = json.loads(written.read_text())
    assert doc["manifest"]["study"] == {"name": "matching", "digest": study["digest"]}


def test_plugin_study_contradicting_run_fails_before_it_measures(fake, monkeypatch):
    fake.makepyfile(test_study=USER)
    path, study = _freeze(fake, "pinned", "--vllm-ascend", PINNED_VLLM_ASCEND, "--layers", "61")
    monkeypatch.setenv("AFD_STUDY", str(path))  # the environment variable works as the flag
    result = run_fast(fake)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*the run contradicts the frozen study 'pinned' ({study['digest']}) in 2 field(s):*",
        f"*stack.vllm_ascend: study '{PINNED_VLLM_ASCEND}', run '<absent: *",
        "*stack.model.layers: study 61, run 2*",
    ])
    assert _results(fake) == []  # nothing measured, nothing written
    assert not (fake.path / "written.txt").exists()


def test_plugin_study_hand_edited_file_is_a_usage_error(fake):
    fake.makepyfile(test_study=USER)
    path, _ = _freeze(fake, "edited")
    path.write_text(path.read_text().replace('"warmups": 1', '"warmups": 5'))
    result = run_fast(fake, "--afd-study", str(path))
    assert result.ret == 4  # pytest's usage error: nothing ran
    result.stderr.fnmatch_lines([
        f"*--afd-study: study {path}: field 'digest' is sha256:* but the content hashes to "
        "sha256:*: the file was edited after it was frozen*"])


GATE_THEN_STAGE = """
import pytest

@pytest.mark.gate
def test_study_gate(record_case):
    record_case()

@pytest.mark.stage_a
def test_study_stage(record_case):
    record_case()
"""


def test_plugin_study_gates_are_checked_on_the_stack_only(fake):
    """A gate runs its own small model and layouts: another layer count is not a contradiction
    for it, but is for the stage case after it (the cached session manifest is rechecked)."""
    fake.makepyfile(test_study=USER)
    path, _ = _freeze(fake, "layers", "--layers", "61")
    fake.makepyfile(test_study=GATE_THEN_STAGE)
    result = run_fast(fake, "--afd-study", str(path))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_study_stage*", "*stack.model.layers: study 61, run 2*"])
    for written in _results(fake):
        written.unlink()
    fake.makepyfile(test_study=USER)
    pinned, _ = _freeze(fake, "pinned", "--vllm-ascend", PINNED_VLLM_ASCEND)
    fake.makepyfile(test_study=GATE_THEN_STAGE)
    run_fast(fake, "--afd-study", str(pinned)).assert_outcomes(failed=2)


SERVED_LATER_CONFTEST = """
from pytest_afd.results.manifest import absent, manifest_digest
from pytest_afd.results.stand_in import SERVED_LATER

# A deploy-command session: the layer count is unknown until the deployment is up.
FakeBackend.describe = lambda self: {"model": {"num_layers": absent(SERVED_LATER.format(path="/ckpt"))}}


@pytest.fixture
def served_case(record_case, afd_manifest):
    def record():  # the result's manifest with what the deployment reported once up
        doc = {key: value for key, value in afd_manifest.items() if key != "digest"}
        doc["model"] = {**doc["model"], "num_layers": int(os.environ["FAKE_SERVED_LAYERS"])}
        doc["digest"] = manifest_digest(doc)
        return record_case(manifest=doc)
    return record
"""
SERVED = """
import pytest

@pytest.mark.stage_a
def test_study_served(served_case):
    served_case()
"""


def test_plugin_study_layers_a_deployment_reports_later_are_checked_on_the_result(
        fake, monkeypatch):
    """Deploy-command mode: the layer count is deferred (not refused) before measuring, and a
    served count that contradicts the study fails the case when its result is written."""
    from tests.support.plugin_pytester import FAKE_CONFTEST

    fake.makeconftest(FAKE_CONFTEST + SERVED_LATER_CONFTEST)
    fake.makepyfile(test_study=USER)
    path, _ = _freeze(fake, "served", "--layers", "2")
    fake.makepyfile(test_study=SERVED)
    monkeypatch.setenv("FAKE_SERVED_LAYERS", "2")
    run_fast(fake, "--afd-study", str(path)).assert_outcomes(passed=1)
    for written in _results(fake):
        written.unlink()
    monkeypatch.setenv("FAKE_SERVED_LAYERS", "5")
    result = run_fast(fake, "--afd-study", str(path))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the run contradicts the frozen study 'served'*",
                                 "*stack.model.layers: study 2, run 5*"])
