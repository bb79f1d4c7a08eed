"""Fixtures shared by several test files."""

import pytest


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, monkeypatch_module):
    """A local Ray cluster for one test module, its files in a temporary directory."""
    import ray

    monkeypatch_module.setenv("RAY_TMPDIR", str(tmp_path_factory.mktemp("ray")))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
