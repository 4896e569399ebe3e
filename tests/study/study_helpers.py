"""Studies and manifests the study tests share: a CPU manifest, a study frozen from it."""

from __future__ import annotations

from pytest_afd.results.manifest import collect_manifest
from pytest_afd.study import cli
from pytest_afd.study.document import load_study
from pytest_afd.topology.spec import parse_topology
from tests.support.result_data import PROTOCOL

REDUCED_LAYERS = 10
FULL_LAYERS = 61


def cpu_manifest(model: str = "reduced", layers: int = REDUCED_LAYERS, topology: str = "dp3pcp8-ep8",
                 environ: dict | None = None, devices_per_node: int = 16) -> dict:
    return collect_manifest(topology=parse_topology(topology), backend_name="cpu",
                            backend_description={"model": {"num_layers": layers}},
                            model_name=model, protocol=PROTOCOL, emulated=True,
                            devices_per_node=devices_per_node, environ=environ or {})


def freeze(tmp_path, *flags: str, name: str = "s") -> dict:
    """``study freeze`` with the CPU model pair and ``flags``; the loaded study."""
    path = tmp_path / f"{name}.json"
    argv = ["freeze", "--name", name, "--output", str(path), "--npu-topology", "dp3pcp8-ep8",
            "--devices-per-node", "16", "--checkpoint", "full", "--layers", str(FULL_LAYERS),
            "--reduced-checkpoint", "reduced", "--reduced-layers", str(REDUCED_LAYERS), *flags]
    assert cli.main(argv) == 0
    return load_study(path)
