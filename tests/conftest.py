"""Fixtures shared by several test files."""

import shutil
import tempfile
from contextlib import contextmanager

import pytest


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny tensors: on a shared 2-core machine (and under
    `pytest -n 2`) a second intra-op thread only adds wake-up latency. Use it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextmanager
def short_tmpdir(prefix: str):
    """A temporary directory directly under the system's temp root. Ray's socket paths must
    fit in 107 bytes, which pytest's tmp_path (deeper still under an xdist worker's
    /tmp/pytest-of-<user>/pytest-N/popen-gwN/...) does not leave room for."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ray_tmpdir():
    with short_tmpdir("ray-") as path:
        yield path


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    """A local Ray cluster for one test module, its files in a short temporary directory."""
    import ray

    with short_tmpdir("ray-") as path:
        monkeypatch_module.setenv("RAY_TMPDIR", path)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()
