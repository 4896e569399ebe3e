"""Deployments a selection needs: ``--afd-list-deployments``, case order, and deployment errors.

A test declares the server-side settings it runs through the
``pytest_afd_deployment_settings`` hook (the stage suites read their
``afd_deployments`` marker). From those declarations:

* ``--afd-list-deployments`` prints (and writes to ``<results dir>/deployments.json``)
  one entry per distinct configuration: settings, topology, model, its
  ``afd-launch-plan`` command line and the cases that use it; nothing runs
  (like ``--collect-only``).
* Under ``AFD_ASCEND_DEPLOY_COMMAND`` cases are ordered so that cases needing
  the same configurations run together, and after each case the deployments no
  later case declares are stopped: each configuration is deployed once.
* A run that asks for settings its case did not declare fails the case (the
  declaration is what the listing and the order rely on).

Deployment errors become outcomes here: no matching deployment skips the case
with the settings named; an unreachable deployment or a bad deployments file
stops the session once, with a non-zero exit status (never a pass/skip list).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.core.markers import STAGE_MARKERS
from pytest_afd.run.session import afd_session, is_worker
from pytest_afd.scheduling import study_cost

PLUGIN_NAME = "afd-deployments"
FLAG = "--afd-list-deployments"
DEST = "afd_list_deployments"
LISTING_FILE = "deployments.json"
HARDWARE_BACKEND = "vllm-ascend"
STUDY_PLUGIN_NAME = "afd-study"
"""``pytest_afd.run.study_plugin.PLUGIN_NAME`` (not imported: the study room loads only with a study)."""
DEPLOY_TIME_FLAG = "--afd-deploy-time-s"
DEPLOY_TIME_DEST = "afd_deploy_time_s"
EXIT_DEPLOYMENT_ERROR = 7
"""Exit status of a session stopped by a deployment error (unreachable, never healthy, bad file)."""
_DECLARED = pytest.StashKey[dict[str, list[dict[str, Any]]]]()
_NEEDED_AFTER = pytest.StashKey[dict[str, set[str]]]()


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(FLAG, dest=DEST, action="store_true", default=False,
                    help="print the deployments (server-side settings, afd-launch-plan command "
                         "line, cases) the selected cases need and their estimated device time "
                         f"as JSON, write them to <results dir>/{LISTING_FILE}, and run nothing")
    group.addoption(DEPLOY_TIME_FLAG, dest=DEPLOY_TIME_DEST, default=None,
                    help="seconds one deployment takes to come up, for the listing's device-time "
                         "estimate (default: the median recorded by earlier sessions under "
                         "<results dir>/deployments, else "
                         f"{study_cost.DEFAULT_DEPLOY_TIME_S:g} s)")


def given_deploy_time(config: pytest.Config) -> float | None:
    """``--afd-deploy-time-s`` as seconds > 0, or None; a bad value is a usage error naming it."""
    text = config.getoption(DEPLOY_TIME_DEST)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise pytest.UsageError(f"{DEPLOY_TIME_FLAG}={text!r}: expected seconds > 0")
    return value


def _deployment_errors() -> tuple[type[BaseException], ...]:
    from pytest_afd.backends.vllm_ascend.deployments import (
        DeploymentConfigError,
        DeploymentUnreachable,
    )

    return DeploymentUnreachable, DeploymentConfigError


def _launch_key_text(settings: RunSettings) -> str:
    from pytest_afd.backends.vllm_ascend.deployments import key_text, launch_key

    return key_text(launch_key(settings))


def declared(config: pytest.Config, item: pytest.Item) -> list[dict[str, Any]] | None:
    """``[{"settings": RunSettings, "npu_topology": str, "model": str}, ...]`` or None (undeclared)."""
    entries = config.hook.pytest_afd_deployment_settings(config=config, item=item)
    if entries is None:
        return None
    options = afd_session(config).options
    return [{"settings": entry["settings"],
             "npu_topology": entry.get("npu_topology") or options.topology.canonical,
             "model": entry.get("model") or options.model,
             "cases": entry.get("cases") or 1} for entry in entries]


def _entry_key(entry: dict[str, Any]) -> str:
    return json.dumps([entry["npu_topology"], entry["model"],
                       _launch_key_text(entry["settings"])])


def _group_order(items: list[pytest.Item], keys: dict[str, list[str]]) -> list[pytest.Item]:
    """Cases sharing a configuration run together (``study_cost.configuration_order``), so
    each configuration deploys once per session, however many stages it holds."""
    by_id = {item.nodeid: item for item in items}
    return [by_id[nodeid] for nodeid in study_cost.configuration_order(list(by_id), keys)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    state = afd_session(config)
    deploying = bool(os.environ.get("AFD_ASCEND_DEPLOY_COMMAND"))
    if state.options.backend != HARDWARE_BACKEND or not (config.getoption(DEST) or deploying):
        return
    table = {item.nodeid: found for item in items
             if (found := declared(config, item)) is not None}
    config.stash[_DECLARED] = table
    keys = {nodeid: [_entry_key(entry) for entry in entries] for nodeid, entries in table.items()}
    if deploying:
        items[:] = _group_order(items, keys)
    needed: set[str] = set()
    after: dict[str, set[str]] = {}
    for item in reversed(items):  # what every later case still needs, per case
        after[item.nodeid] = set(needed)
        needed.update(keys.get(item.nodeid, ()))
    config.stash[_NEEDED_AFTER] = after


def listing(config: pytest.Config, items: list[pytest.Item]) -> dict[str, Any]:
    """The ``--afd-list-deployments`` document."""
    from pytest_afd.backends.vllm_ascend.listing import plan_document
    from pytest_afd.topology.spec import parse_topology

    options = afd_session(config).options
    table = config.stash.get(_DECLARED, {})
    entries: dict[str, dict[str, Any]] = {}
    for item in items:
        for entry in table.get(item.nodeid, ()):
            key = _entry_key(entry)
            if key not in entries:
                topology = parse_topology(entry["npu_topology"], options.aliases)
                entries[key] = {**plan_document(topology, entry["model"], entry["settings"],
                                                devices_per_node=options.devices_per_node,
                                                environ=os.environ),
                                "devices_per_node_given": options.devices_per_node_given,
                                "cases": []}
            if item.nodeid not in entries[key]["cases"]:
                entries[key]["cases"].append(item.nodeid)
    undeclared = [item.nodeid for item in items if item.nodeid not in table]
    estimate = _estimate(config, items, table)
    notes = [] if options.devices_per_node_given else [
        f"nodes and afd_launch_plan assume the default {options.devices_per_node} NPUs per node: "
        "pass --afd-devices-per-node (or AFD_DEVICES_PER_NODE) with your nodes' count"]
    return {"deployments": list(entries.values()), "undeclared_cases": undeclared,
            "notes": notes, "estimated_device_time": estimate,
            "undeclared_note": "these cases declare no deployments (pure-Python checks, or "
                               "gates: they deploy on first use)"}


def _stage_of(item: pytest.Item) -> str:
    """The stage a case belongs to (what one stage session would hold), or ``other``."""
    return next((name for name in STAGE_MARKERS if item.get_closest_marker(name)), "other")


def _estimate(config: pytest.Config, items: list[pytest.Item],
              table: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The selection's device time (``study_cost.estimate``) in the order it would run."""
    options = afd_session(config).options
    keys = {nodeid: [_entry_key(entry) for entry in entries] for nodeid, entries in table.items()}
    nodeids = [item.nodeid for item in items]
    sessions: dict[str, list[str]] = {}
    for item in items:
        sessions.setdefault(_stage_of(item), []).append(item.nodeid)
    try:
        deploy_s, source = study_cost.deploy_time(given_deploy_time(config), options.results_dir)
    except ValueError as error:  # a recorded deploy-times file that is not one
        raise pytest.UsageError(f"{FLAG}: {error}") from None
    warmups, repetitions, protocol_source = _protocol(config)
    estimate = study_cost.estimate(
        runs_per_repetition=sum(entry["cases"] for entries in table.values() for entry in entries),
        cases=len(table),
        deploys=study_cost.deploys_needed(study_cost.configuration_order(nodeids, keys), keys),
        deploys_separately=study_cost.deploys_by_session(sessions, keys),
        deploy_s=deploy_s, deploy_source=source, warmups=warmups, repetitions=repetitions)
    return {**estimate, "protocol_source": protocol_source,
            "summary": f"{estimate['summary']}; repetitions from the {protocol_source}"}


def _protocol(config: pytest.Config) -> tuple[int, tuple[int, int], str]:
    """(warmups, (fewest, most) repetitions, where they came from) for the estimate.

    Under ``--afd-study`` the frozen study's protocol is what the study will spend,
    so it wins over the session's options (a session that differs is the user's
    next surprise, and the listing names the study it priced); otherwise the
    session's ``--afd-warmups`` / ``--afd-repeats`` (a range under ``--afd-sequential``).
    """
    options = afd_session(config).options
    high = options.max_repeats if options.sequential else options.repeats
    study = getattr(config.pluginmanager.get_plugin(STUDY_PLUGIN_NAME), "study", None)
    protocol = (study or {}).get("protocol") or {}
    if not {"warmups", "repetitions"} <= protocol.keys():
        return options.warmups, (options.repeats, high), "session options"
    repetitions = int(protocol["repetitions"])
    fewest_most = (repetitions, max(repetitions, high)) if options.sequential else (
        repetitions, repetitions)
    return (int(protocol["warmups"]), fewest_most,
            f"study {study['name']!r} ({study['digest']}) protocol")


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption(DEST) or is_worker(config):
        return
    document = listing(config, session.items)
    text = json.dumps(document, indent=2)
    results_dir = afd_session(config).options.results_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / LISTING_FILE).write_text(text + "\n")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"pytest-afd: {document['estimated_device_time']['summary']}\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """``--afd-list-deployments`` runs nothing (as ``--collect-only``)."""
    return True if session.config.getoption(DEST) else None


def _stop_session(error: BaseException) -> None:
    pytest.exit(f"pytest-afd: deployment error: {error}", returncode=EXIT_DEPLOYMENT_ERROR)


def _deploying(config: pytest.Config) -> bool:
    """Deployment errors are outcomes only in a session on the hardware backend."""
    return afd_session(config).options.backend == HARDWARE_BACKEND


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not _deploying(item.config):
        return (yield)
    try:
        return (yield)
    except _deployment_errors() as error:
        _stop_session(error)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    from pytest_afd.backends.vllm_ascend.deployments import DeploymentMissing

    if not _deploying(item.config):
        return (yield)
    backend = afd_session(item.config).backend_instance
    requested = getattr(backend, "requested", None)
    before = len(requested) if requested is not None else 0
    try:
        result = yield
    except DeploymentMissing as error:
        raise pytest.skip.Exception(f"no deployment for this case: {error}",
                                    _use_item_location=True) from None
    except _deployment_errors() as error:
        _stop_session(error)
    undeclared_runs(item, requested[before:] if requested is not None else [])
    return result


def undeclared_runs(item: pytest.Item, requested: list[RunSettings]) -> None:
    """Fail the case when it ran settings it did not declare (listing and order rely on them)."""
    entries = item.config.stash.get(_DECLARED, {}).get(item.nodeid)
    if entries is None or not requested:
        return
    options = afd_session(item.config).options
    known = {_launch_key_text(entry["settings"]) for entry in entries
             if (entry["npu_topology"], entry["model"]) == (options.topology.canonical, options.model)}
    extra = sorted({_launch_key_text(settings) for settings in requested} - known)
    if extra:
        pytest.fail(f"{item.nodeid} ran server-side settings it does not declare (marker "
                    f"afd_deployments / hook pytest_afd_deployment_settings): {extra}", pytrace=False)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop deployments no later case declares (deploy-command mode; attach mode keeps all)."""
    after = item.config.stash.get(_NEEDED_AFTER, None)
    backend = afd_session(item.config).backend_instance
    release = getattr(backend, "release_deployments", None)
    if after is None or release is None or item.nodeid not in after:
        return
    options = afd_session(item.config).options

    def own(keys: Any) -> set[str]:
        """The launch keys on the session's own topology and model (its backend's pool)."""
        found = set()
        for key in keys:
            topology, model, settings = json.loads(key)
            if (topology, model) == (options.topology.canonical, options.model):
                found.add(settings)
        return found

    everything = {key for entries in item.config.stash[_DECLARED].values()
                  for key in map(_entry_key, entries)}
    # Only declared configurations are released; one a case deployed undeclared stays up.
    release(own(everything) - own(after[item.nodeid]))
