"""Calls with a time limit, for code we did not write (users' reward functions, external
graders): a call that does not return in time is abandoned, and the caller goes on.

Imports nothing else from posttrain.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from typing import Any, Callable


class FunctionTimeout(Exception):
    pass


class CallThread:
    """One daemon thread that runs the calls handed to it, so that a call with a timeout
    costs a hand-off (~10 µs measured here) rather than a thread start (~90 µs with torch
    loaded: 256 samples a step made that 25 ms or more).

    Python cannot stop a thread. A call that times out is abandoned: its thread keeps
    running (and holding whatever it holds) until the function returns or the process
    exits, then waits for work that never comes. It is a daemon, so it never keeps the
    process alive (a ThreadPoolExecutor's thread is joined at exit: one hung call would
    keep the process from ending). A caller that goes on after a timeout starts a fresh
    CallThread (`busy` says the old one is stuck), so a hung call never delays the next one."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = False
        threading.Thread(target=self.serve, name="posttrain-timed-call", daemon=True).start()

    def serve(self) -> None:
        while True:
            fn, kwargs, box, done = self.requests.get()
            try:
                box["value"] = finish(fn(**kwargs))
            except BaseException as error:  # handed to the caller, who names the function and sample
                box["error"] = error
            done.set()

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
        """fn(**kwargs), awaited if it returns an awaitable; FunctionTimeout after `timeout` s."""
        box: dict[str, Any] = {}
        done = threading.Event()
        self.busy = True
        self.requests.put((fn, kwargs, box, done))
        if not done.wait(timeout):
            raise FunctionTimeout
        self.busy = False
        if "error" in box:
            raise box["error"]
        return box["value"]


def finish(value: Any) -> Any:
    """An async function's result, run to completion on a fresh event loop."""
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value
