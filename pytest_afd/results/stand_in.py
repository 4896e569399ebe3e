"""A case served by the harness's own CPU server standing in for a deployment: labelled emulated.

The server reports what it is (``/afd/describe``: device ``cpu``); a result
measured on it must never read as hardware, whatever the session's backend
name says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_afd.results.manifest import absent, manifest_digest

STAND_IN_REASON = ("emulated: ran on the pytest-afd CPU server standing in for the deployment "
                   "(it reports device {device!r} at /afd/describe)")
SERVED_LATER = ("not known before the deploy command's deployment is up: the checkpoint's "
                "config.json ({path}) is not readable here; a pytest-afd server reports its "
                "layer count at /afd/describe, and each result's manifest carries it")
"""The session manifest's layer count in deploy-command mode when the checkpoint cannot be
read from the harness's host: the deployment does not exist until the first case asks for
it, so the count is learned from it (:func:`with_served_facts`) and checked on the result
(the study's check defers this one field: ``pytest_afd.study.check.served_later``)."""
SERVED_LATER_PREFIX = SERVED_LATER.split(":", 1)[0]


def as_stand_in(manifest: Mapping[str, Any], device: str, emulation: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` relabelled for a case served by the harness's own server (device ``device``).

    The server reports what it is; a result measured on it must never read as
    hardware, whatever the session's backend name says.
    """
    doc = {key: value for key, value in manifest.items() if key != "digest"}
    hardware = dict(doc["hardware"])
    if not hardware.get("emulated"):
        hardware.update(emulated=True, device_type=f"{device} (pytest-afd server standing in)",
                        fabric=absent("emulated on CPU: no NPU fabric"))
        doc["hardware"] = hardware
        doc["topology"] = {**doc["topology"], "cpu_emulation": dict(emulation)}
    doc["digest"] = manifest_digest(doc)
    return doc


def with_served_facts(manifest: Mapping[str, Any], backend: Any) -> dict[str, Any]:
    """``manifest`` with what the serving deployment reports once it is up (deploy-command mode).

    A deployment the harness deploys on first use cannot describe itself when
    the session's manifest is made; after its runs, the harness's own server
    reports its device (emulated) and layer count at ``/afd/describe``. Facts
    already in the manifest are kept; a backend that reports nothing changes nothing.
    """
    ask = getattr(backend, "stand_in_description", None)
    described = ask() if ask is not None else None
    if not described:
        return dict(manifest)
    doc = {key: value for key, value in manifest.items() if key != "digest"}
    layers = described.get("model", {}).get("num_layers")
    if isinstance(doc["model"].get("num_layers"), Mapping) and layers is not None:
        doc["model"] = {**doc["model"], "num_layers": layers}
    emulation = described.get("topology_emulation")
    if described.get("device") is not None and emulation is not None:
        return as_stand_in(doc, str(described["device"]), emulation)
    doc["digest"] = manifest_digest(doc)
    return doc


