"""The workflows' supply chain (issue 40, finding 9): zizmor finds nothing of medium or high
severity; every action is pinned to a full commit with its tag in a comment; every checkout
drops its credentials; the nightly image's digest check fails on a moved or unrecorded tag."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
DIGEST_CHECK = REPO / ".ci" / "check-image-digest"
FAILING_SEVERITIES = {"High", "Medium"}
PINNED_USES = re.compile(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}  # v\d+(\.\d+)*")
IMAGE = "quay.io/ascend/vllm-ascend:v0.19.1rc1-a3-openeuler"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def zizmor_findings(directory: Path) -> list[dict]:
    if shutil.which("zizmor") is None:
        pytest.skip("zizmor is not installed (the [test] extra installs it)")
    done = subprocess.run(["zizmor", "--offline", "--format", "json", str(directory)],
                          capture_output=True, text=True, check=False)
    assert done.stdout.strip(), done.stderr  # zizmor exits non-zero on findings
    return json.loads(done.stdout)


def failing(findings: list[dict]) -> list[str]:
    return [f"{f['ident']} ({f['determinations']['severity']})" for f in findings
            if f["determinations"]["severity"] in FAILING_SEVERITIES]


def test_zizmor_finds_no_medium_or_high_finding():
    assert failing(zizmor_findings(WORKFLOWS)) == []


def test_zizmor_sees_an_unpinned_action_and_persisted_credentials(tmp_path):
    """The check can fail: one workflow with a tag-pinned checkout that keeps its credentials."""
    text = (WORKFLOWS / "nightly-cpu.yml").read_text()
    broken = re.sub(r"actions/checkout@[0-9a-f]{40}  # [^\n]*\n(\s+)with:\n\s+persist-credentials: false\n",
                    "actions/checkout@v4\n", text, count=1)
    assert broken != text
    copy = tmp_path / ".github" / "workflows"
    copy.mkdir(parents=True)
    (copy / "nightly-cpu.yml").write_text(broken)
    found = failing(zizmor_findings(copy))
    assert "unpinned-uses (High)" in found and "artipacked (Medium)" in found, found


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.yml")), ids=lambda p: p.name)
def test_every_action_is_pinned_and_every_checkout_drops_credentials(path):
    lines = path.read_text().splitlines()
    uses = [(i, line) for i, line in enumerate(lines) if "uses:" in line]
    assert uses
    for index, line in uses:
        assert PINNED_USES.search(line), f"{path.name}:{index + 1}: {line.strip()}"
        if "actions/checkout@" in line:
            block = "\n".join(lines[index + 1:index + 6])
            assert "persist-credentials: false" in block, f"{path.name}:{index + 1}"


def run_check(*args: str, env_output: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"}
    if env_output is not None:
        env["GITHUB_OUTPUT"] = str(env_output)
    return subprocess.run([sys.executable, str(DIGEST_CHECK), *args], capture_output=True,
                          text=True, check=False, env=env)


def test_image_digest_check_passes_the_recorded_digest_and_pins_it(tmp_path):
    digests = tmp_path / "digests.txt"
    digests.write_text(f"# comment\n{IMAGE} {DIGEST_A}\n")
    output = tmp_path / "out"
    done = run_check(IMAGE, "--digests", str(digests), "--resolved", DIGEST_A, env_output=output)
    assert done.returncode == 0, done.stderr
    assert output.read_text() == f"image=quay.io/ascend/vllm-ascend@{DIGEST_A}\n"


def test_image_digest_check_fails_when_the_tag_moves(tmp_path):
    digests = tmp_path / "digests.txt"
    digests.write_text(f"{IMAGE} {DIGEST_A}\n")
    done = run_check(IMAGE, "--digests", str(digests), "--resolved", DIGEST_B)
    assert done.returncode == 1
    assert "the tag moved" in done.stderr and DIGEST_A in done.stderr and DIGEST_B in done.stderr


def test_image_digest_check_fails_on_an_unrecorded_tag_and_prints_the_line(tmp_path):
    digests = tmp_path / "digests.txt"
    digests.write_text("# nothing recorded\n")
    done = run_check(IMAGE, "--digests", str(digests), "--resolved", DIGEST_B)
    assert done.returncode == 1
    assert f"'{IMAGE} {DIGEST_B}'" in done.stderr


def test_image_digest_check_names_a_malformed_line(tmp_path):
    digests = tmp_path / "digests.txt"
    digests.write_text(f"{IMAGE} latest\n")
    done = run_check(IMAGE, "--digests", str(digests), "--resolved", DIGEST_A)
    assert done.returncode == 2 and "digests.txt:1" in done.stderr


def test_the_checked_in_digest_file_parses():
    done = run_check(f"quay.io/x/y@{DIGEST_A}")  # by digest: passes without the registry
    assert done.returncode == 0, done.stderr
    assert run_check("x/y:1", "--resolved", DIGEST_A).returncode == 1  # unrecorded
