"""Backends other than the session's (another model depth or topology), with their manifests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.core.backend import (
    Backend,
    BackendUnavailable,
)
from pytest_afd.results.documents import validate_manifest
from pytest_afd.results.manifest import collect_manifest, manifest_digest
from pytest_afd.run.session import EXIT_BACKEND_UNAVAILABLE, afd_session
from pytest_afd.topology.spec import Topology, parse_topology


@dataclass
class BackendHandle:
    """A backend with the manifest its results embed (model and topology differ per handle)."""

    backend: Backend
    manifest: dict[str, Any]
    topology: Topology
    model_name: str


class BackendPool:
    """The session backend plus, on demand, backends for another model or topology.

    Stage A repeats cases on ``full``, Stage E crosses depth with routing and
    Stage F runs a PP layout; each needs its own backend and manifest. Made
    with the public factory, cached for the session, closed at its end.
    """

    def __init__(self, config: pytest.Config, session: BackendHandle) -> None:
        self.config = config
        self.options = afd_session(config).options
        self.session = session
        self._made: dict[tuple[str, str], BackendHandle] = {}

    def get(
        self, *, model_name: str | None = None, topology_spec: str | None = None
    ) -> BackendHandle:
        model = model_name or self.session.model_name
        topology = (
            self.session.topology
            if topology_spec is None
            else parse_topology(topology_spec, self.options.aliases)
        )
        if (
            model == self.session.model_name
            and topology.canonical == self.session.topology.canonical
        ):
            return self.session
        key = (model, topology.canonical)
        if key not in self._made:
            try:
                backend = create_backend(
                    self.options.backend,
                    topology=topology,
                    model_name=model,
                    seed=self.options.seed,
                    results_dir=self.options.results_dir,
                    peer_timeout_s=self.options.peer_timeout_s,
                    **afd_session(self.config).hardware_kwargs(),
                )
            except BackendUnavailable as exc:
                message = f"backend {self.options.backend!r} for model {model!r} on {topology}: {exc}"
                if self.options.require_hardware:  # one session error, as afd_backend's
                    pytest.exit(f"pytest-afd: --afd-require-hardware: {message}",
                                returncode=EXIT_BACKEND_UNAVAILABLE)
                pytest.skip(message)
            afd_session(self.config).other_backends.append(backend)  # the ledger counts its runs
            self._made[key] = BackendHandle(
                backend, self._manifest(backend, topology, model), topology, model
            )
        return self._made[key]

    def _manifest(self, backend: Backend, topology: Topology, model: str) -> dict[str, Any]:
        manifest = collect_manifest(
            topology=topology,
            backend_name=self.options.backend,
            backend_description=backend.describe(),
            model_name=model,
            protocol=self.options.protocol(),
            emulated=self.session.manifest["hardware"]["emulated"],
            devices_per_node=self.options.devices_per_node,
        )
        self.config.hook.pytest_afd_manifest(config=self.config, manifest=manifest)
        manifest["digest"] = manifest_digest(manifest)
        validate_manifest(manifest)
        return manifest

    def close(self) -> None:
        made, self._made = self._made, {}
        others = afd_session(self.config).other_backends
        others[:] = [backend for backend in others
                     if all(backend is not handle.backend for handle in made.values())]
        for handle in made.values():
            handle.backend.close()
