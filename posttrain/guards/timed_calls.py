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


class RaisedBaseException(Exception):
    """The called function raised a BaseException that is not an Exception: SystemExit
    (sys.exit() or exit(), often a library's or argparse's), KeyboardInterrupt, GeneratorExit
    or a class of its own. Re-raised as itself in the caller's thread it would stop the
    caller as if the caller had exited or been interrupted (a reward function's sys.exit(0)
    ended a whole run with status 0 and no message), and the caller could not tell it from
    a Ctrl-C of its own wait. As this Exception it is one more way the call failed, which
    the caller names and handles like any other. `error` is the original, with its traceback."""

    def __init__(self, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


def raised(error: BaseException) -> BaseException:
    """What the called function itself raised: the original inside a RaisedBaseException."""
    return error.error if isinstance(error, RaisedBaseException) else error


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
            except Exception as error:  # handed to the caller, who names the function and sample
                box["error"] = error
            except BaseException as error:  # noqa: BLE001  (the callee's, not a stop of this process)
                box["error"] = RaisedBaseException(error)
            done.set()

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
        """fn(**kwargs), awaited if it returns an awaitable; FunctionTimeout after `timeout` s.
        What fn raises is raised here, a BaseException that is not an Exception as a
        RaisedBaseException; a KeyboardInterrupt from here is a Ctrl-C of this thread's wait."""
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


def call_here(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """fn(**kwargs) in this thread, awaited if it returns an awaitable: CallThread.call
    without the time limit, for code that needs the main thread (signal handlers). What fn
    raises is raised here, a SystemExit or another BaseException that is not an Exception
    as a RaisedBaseException; a KeyboardInterrupt is let through as itself, since in this
    thread it may be the user's Ctrl-C (the caller can say what was running)."""
    try:
        return finish(fn(**kwargs))
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as error:  # noqa: BLE001  (the callee's, not a stop of this process)
        raise RaisedBaseException(error) from None


def finish(value: Any) -> Any:
    """An async function's result, run to completion on a fresh event loop."""
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value
