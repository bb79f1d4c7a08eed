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


# The files that take longest, heaviest first: their summed test time in one `make test` of
# 2026-12-03 on the 2-core Intel Xeon (--durations=0), from ~300 s (test_lessons.py) down to
# ~35 s. `--dist loadfile` hands whole files to the workers in collection order, so a long file
# collected late keeps one worker busy while the other has nothing left; handed out first, the
# short files fill in behind them (longest-processing-time-first scheduling).
HEAVIEST_FIRST = [
    "test_lessons.py", "test_docs_pages.py", "test_lesson17_26.py", "test_recipes.py", "test_pipeline.py",
    "test_docs_site.py", "test_humaneval_attacks.py", "test_checkpoint_task.py", "test_distributed.py",
    "test_lesson_charts_b.py", "test_distributed_faults.py", "test_int8_rollout.py", "test_rlhf.py",
    "test_humaneval_env.py", "test_compare.py", "test_stages.py", "test_hf.py", "test_partial_rollouts.py",
    "test_api_objects.py", "test_code_attacks.py", "test_cli.py", "test_verifiers.py", "test_trackers.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept
