"""The value checks every config section runs in its `validate()`: one error type, and a
message that names the setting, its value and what is allowed.

    check(ok, name, value, allowed)      the one way a check fails (ConfigError); PosttrainWarning
                                         is the category of what can run but should be read
    check_positive / check_non_negative  several fields of a section at once
    check_device                         the names --device and --dtype can take
    check_threads                        --threads: torch's intra-op threads, 0 or up to 4 a core
"""

from __future__ import annotations

import os
from typing import Any


class ConfigError(ValueError):
    """A setting has a value the program cannot use. The message names the field."""


class PosttrainWarning(UserWarning):
    """What a job can go on with but the person running it should read (a data file's repeated
    rows): the category of posttrain's own warnings.warn. The command line prints each once, as
    one line (runs/console.py print_warnings_once); from Python it is a UserWarning like any."""


def check(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise ConfigError naming the setting, its value and what is allowed, unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}={value!r} is not allowed: expected {allowed}")


def check_positive(section: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        check(isinstance(value, int) and value > 0, f"{prefix}.{name}".lstrip("."), value, "a positive integer")


def check_non_negative(section: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        check(value >= 0, f"{prefix}.{name}", value, f"{'an integer' if isinstance(value, int) else 'a number'} >= 0")


DEVICES = ("auto", "cpu", "cuda", "mps")  # posttrain/models/device.py resolves them
DTYPES = ("float32", "bfloat16")


def check_device(section: Any) -> None:
    """The names of section.device and section.dtype; whether that device exists here is
    pipelines/checks.py's check (it needs torch)."""
    check(section.device in DEVICES, "device", section.device, f"one of {list(DEVICES)} (auto = cuda, mps, then cpu)")
    check(section.dtype in DTYPES, "dtype", section.dtype, f"one of {list(DTYPES)}")


def check_threads(section: Any) -> None:
    """section.threads: torch's intra-op threads for a command's work, 0 = torch's default."""
    # an OS thread each: past a few per core they only contend, and 99999 hit the thread limit: a segfault
    cores = os.cpu_count() or 1
    check(0 <= section.threads <= 4 * cores, "threads", section.threads,
          f"an integer in [0, {4 * cores}] (0 = torch's default; at most 4 per core, and this machine has {cores})")
