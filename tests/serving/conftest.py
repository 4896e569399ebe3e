"""The real CPU backend (reduced model) the in-process serving tests serve, one per module."""

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.topology.spec import parse_topology
from tests.support.serving_test_helpers import MODEL


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    backend = create_backend("cpu", topology=parse_topology("dp3pcp8-ep8"), model_name=MODEL, seed=0,
                             results_dir=tmp_path_factory.mktemp("server-results"))
    yield backend
    backend.close()
