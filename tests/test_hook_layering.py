"""The import-linter contracts of afd_split.hook (pyproject ``[tool.importlinter]``): facts <
planning < glue < patches < install, the patch files independent, install the only importer
of the patches; each shown breaking once on a copy of the tree."""

import pytest

from tests.support.import_contracts import REPO_ROOT, assert_violation_reported, run_import_linter

HOOK_LAYERS = "hook layers: facts < planning < glue < patches < install"
PATCHES_INDEPENDENT = "the hook's patch files never import each other (one file per upstream target)"
INSTALL_ONLY = "only afd_split.hook.install imports the patch files"


def test_the_hook_contracts_are_kept():
    returncode, report = run_import_linter(REPO_ROOT)
    assert returncode == 0, report
    for contract in (HOOK_LAYERS, PATCHES_INDEPENDENT, INSTALL_ONLY):
        assert f"{contract} KEPT" in report, report


VIOLATIONS = {
    # The cycle the re-layering removed: the support rules reaching the PCP runner glue.
    "rules_import_glue": ("afd_split/hook/planning/rules.py",
                          "import afd_split.hook.glue.pcp_seam  # noqa: F401\n", HOOK_LAYERS,
                          "afd_split.hook.planning.rules -> afd_split.hook.glue.pcp_seam"),
    # One patch file reaching another (the shared pieces live in facts).
    "patch_imports_patch": ("afd_split/hook/patches/dispatch.py",
                            "import afd_split.hook.patches.planner  # noqa: F401\n",
                            PATCHES_INDEPENDENT,
                            "afd_split.hook.patches.dispatch -> afd_split.hook.patches.planner"),
}


@pytest.mark.parametrize("violation", sorted(VIOLATIONS))
def test_a_hook_import_that_breaks_a_contract_fails_the_linter(tmp_path, violation):
    assert_violation_reported(tmp_path, *VIOLATIONS[violation])
