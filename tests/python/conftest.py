"""Shared fixtures of the Python client's tests. The live tests need a cluster started by
tests/python/run.sh (which exports LOOM_CLUSTER_DIR and the cluster's LOOM_* settings); without
it they are skipped and only the offline tests run."""

import os
import pathlib

import pytest
import yaml

import loom

REPO_ROOT = pathlib.Path(os.environ.get("LOOM_REPO_ROOT",
                                        pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def client():
    if not os.environ.get("LOOM_CLUSTER_DIR"):
        pytest.skip("no live cluster: run tests/python/run.sh")
    with loom.Client() as c:
        yield c


def demo_dict(**train) -> dict:
    """examples/demo.yaml as a dict, with `train` fields overridden."""
    spec = yaml.safe_load((REPO_ROOT / "examples" / "demo.yaml").read_text())
    spec["train"].update(train)
    return spec
