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
from pytest_afd.run import ab as afd_ab
from pytest_afd.run import ab_sides as afd_ab_sides
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
        self, *, model_name: str | None = None, topology_spec: str | None = None,
        side: str | None = None,
    ) -> BackendHandle:
        """``side`` (``ab-A`` / ``ab-B``): that side's backend under ``--afd-ab-url`` /
        ``--afd-ab-python`` / ``--afd-ab-checkout`` (pytest_afd.run.ab_sides), where the
        session backend is side A and every other backend is made for its side."""
        sides = afd_ab_sides.from_config(self.config)
        side = (side or afd_ab.SIDES[0]) if sides is not None else None
        model = model_name or self.session.model_name
        topology = (
            self.session.topology
            if topology_spec is None
            else parse_topology(topology_spec, self.options.aliases)
        )
        if (
            model == self.session.model_name
            and topology.canonical == self.session.topology.canonical
            and side in (None, afd_ab.SIDES[0])
        ):
            return self.session
        key = (side or "", model, topology.canonical)
        if key not in self._made:
            try:
                backend = self._create(model, topology, None if sides is None else sides.side(side))
            except BackendUnavailable as exc:
                where = "" if side is None else f" (--afd-ab side {side})"
                message = f"backend {self.options.backend!r}{where} for model {model!r} on {topology}: {exc}"
                if self.options.require_hardware:  # one session error, as afd_backend's
                    pytest.exit(f"pytest-afd: --afd-require-hardware: {message}",
                                returncode=EXIT_BACKEND_UNAVAILABLE)
                pytest.skip(message)
            afd_session(self.config).other_backends.append(backend)  # the ledger counts its runs
            self._made[key] = BackendHandle(
                backend, self._manifest(backend, topology, model), topology, model
            )
        return self._made[key]

    def side(self, side: str, handle: BackendHandle) -> BackendHandle:
        """``handle``'s model and topology on A/B side ``side``."""
        if handle is self.session and side == afd_ab.SIDES[0]:
            return handle
        return self.get(model_name=handle.model_name, topology_spec=handle.topology.canonical,
                        side=side)

    def _create(self, model: str, topology: Topology, side: afd_ab_sides.Side | None) -> Backend:
        common = {"topology": topology, "model_name": model, "seed": self.options.seed,
                  "results_dir": self.options.results_dir,
                  **afd_session(self.config).hardware_kwargs()}
        if side is not None:
            return afd_ab_sides.create_side_backend(side, **common)
        return create_backend(self.options.backend, peer_timeout_s=self.options.peer_timeout_s,
                              **common)

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
