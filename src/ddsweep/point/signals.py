"""How run-point turns a signal (Slurm's pre-timeout signal, scancel, Ctrl-C, its own alarm) into the end of its
point: the server stopped at once, the point recorded as interrupted, and no exception raised inside the benchmark's
event loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable


class Interrupted(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP arrived (Slurm's pre-timeout signal, scancel, Ctrl-C, a closed terminal).

    A KeyboardInterrupt, as Python's own interruption: what handles those (an attempt's marks, an event loop's
    callbacks) handles it alike."""


def install_handlers(received: list[str], time_limit: str = "", on_signal: Callable[[], None] | None = None,
                     named: list[str] | None = None, benchmarking: threading.Event | None = None) -> dict:
    """Turn SIGTERM/SIGINT/SIGHUP, and SIGALRM (the alarm set before the job's time limit, named `time_limit`),
    into an Interrupted exception so the server is always stopped; `received` keeps the cause. A signal may reach
    run-point alone (the alarm, a `kill` of run-point, the SIGTERM run-point sends itself when its workflow is gone,
    whose cause is in `named`): `on_signal` signals the server at once, as a signal to every process of the job
    would, so that the step in progress fails even where the interruption is absorbed.

    While `benchmarking` is set the handler raises nothing: raised wherever the benchmark's event loop (or its
    set-up and teardown) happens to be, the exception can leave a lock taken (a thread's future, which the loop's
    executor then waits on forever), be swallowed by one of the loop's callbacks, or leave the loop unclosable. A
    running loop cancels its tasks instead, from its own callback, and again every 0.1 s until it ends (a
    cancellation can be absorbed); run_point reports the interruption when the step returns."""
    def handler(signum: int, _frame: object) -> None:
        alarm = signum == signal.SIGALRM
        cause = (time_limit if alarm and time_limit else named[0] if named and signum == signal.SIGTERM
                 else signal.Signals(signum).name)
        received.append(cause)
        if on_signal is not None:
            on_signal()
        if benchmarking is None or not benchmarking.is_set():
            raise Interrupted(cause)
        with contextlib.suppress(RuntimeError):  # no loop runs yet, or any more: the step ends on its own
            loop = asyncio.get_running_loop()
            loop.call_soon_threadsafe(_cancel_every_task, loop)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM)}


def _cancel_every_task(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task of `loop`, and again in 0.1 s, until the loop stops running them."""
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_later(0.1, _cancel_every_task, loop)
