"""Hooks pytest-afd offers to conftest files and other plugins.

Registered through ``pytest_addhooks``; implement them in a ``conftest.py``
like any pytest hook.
"""

from __future__ import annotations

import pytest


@pytest.hookspec(firstresult=True)
def pytest_afd_create_backend(config, name, topology, model_name, seed, results_dir):
    """Return a backend (``pytest_afd.core.backend.Backend``) to use for this session.

    Called once per process before the registry's ``create_backend``; the
    first non-None result wins. Use it to plug in a custom deployment or a
    fake backend in tests. Raise ``BackendUnavailable`` to skip (or fail under
    ``--afd-require-hardware``) every test that needs the backend.
    """


@pytest.hookspec
def pytest_afd_manifest(config, manifest):
    """Add facts to the session manifest (a dict) before it is digested and validated.

    Mutate ``manifest`` in place and keep it valid against
    ``schemas/manifest.schema.json`` (extra keys are allowed inside ``model``,
    ``hardware``, ``topology`` and ``protocol``).
    """


@pytest.hookspec
def pytest_afd_result_written(config, path, result):
    """Called after a validated result JSON was written atomically to ``path``."""


@pytest.hookspec(firstresult=True)
def pytest_afd_deployment_settings(config, item):
    """The deployments ``item`` runs: a list of ``{"settings": RunSettings, "npu_topology":
    str | None, "model": str | None, "cases": int | None}`` (None: the session's; ``cases``:
    measured cases on it, default 1, for the listing's device-time estimate), or None when
    it declares none.

    ``--afd-list-deployments`` lists them; under ``AFD_ASCEND_DEPLOY_COMMAND`` the
    cases are ordered and deployments stopped by them; a run of undeclared
    server-side settings fails the case. The stage suites implement it from their
    ``afd_deployments`` marker (docs/plugin.md "Deployments").
    """
