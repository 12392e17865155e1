"""The demo app's aiohttp twin: the same endpoints, the same work, the same Server-Timing (lesson 06).

Run it under gunicorn with aiohttp's worker:

    gunicorn "labapp.aiohttp_app:create_app()" --worker-class aiohttp.GunicornWebWorker

Here /io awaits asyncio.sleep, so one process waits on many requests at once; /cpu and /oops
block the event loop exactly as they block a gevent worker. Because handlers share one thread,
`cpu` is the thread's CPU time during the handler minus the CPU spent while it was awaiting
(which belongs to other requests).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

from aiohttp import web

from labapp import work

__all__ = ["create_app"]

_IO_MS, _CPU_AWAY_S = "io_ms", "cpu_away_s"


async def _await_io(request: web.Request, ms: float | None) -> None:
    """Wait on simulated I/O without blocking the loop.

    The I/O takes the time asked of it; a late resumption (the loop busy with another
    request) is contention, not I/O. CPU the thread spends on other requests meanwhile
    is not ours.
    """
    seconds = ms / 1000.0 if ms is not None else work.lognormal_wait_s(work.IO_MEDIAN_S, work.IO_SIGMA)
    c0 = time.thread_time()
    await asyncio.sleep(seconds)
    request[_IO_MS] += seconds * 1000.0
    request[_CPU_AWAY_S] += time.thread_time() - c0


@web.middleware
async def server_timing(request: web.Request, handler):
    start_wall, t0, c0 = time.time(), time.perf_counter(), time.thread_time()
    request[_IO_MS], request[_CPU_AWAY_S] = 0.0, 0.0
    try:
        response = await handler(request)
    except work.BadParameter as err:
        body = {"error": str(err), "parameter": err.name, "value": err.value, "allowed": err.allowed}
        response = web.json_response(body, status=400)
    cpu_ms = (time.thread_time() - c0 - request[_CPU_AWAY_S]) * 1000.0
    app_ms = (time.perf_counter() - t0) * 1000.0
    response.headers["Server-Timing"] = f"app;dur={app_ms:.3f}, cpu;dur={cpu_ms:.3f}, io;dur={request[_IO_MS]:.3f}"
    response.headers["X-Worker-Pid"] = str(os.getpid())
    response.headers["X-Worker-Thread"] = str(id(asyncio.current_task()) or threading.get_ident())
    response.headers["X-Handler-Start"] = f"{start_wall:.6f}"
    response.headers["X-Handler-End"] = f"{start_wall + app_ms / 1000.0:.6f}"
    return response


def _ms(request):
    return work.parse_number(request.query, "ms", 0.0, work.MAX_MS)


async def health(request):
    return web.json_response({"status": "ok", "pid": os.getpid()})


async def io(request):
    await _await_io(request, _ms(request))
    return web.Response(text="ok\n")


async def cpu(request):
    work.burn_cpu(_ms(request))
    return web.Response(text="ok\n")


async def oops(request):
    request[_IO_MS] += work.wait_io_blocking(_ms(request))  # time.sleep: the whole loop stops
    return web.Response(text="ok\n")


async def mixed(request):
    io_fraction = work.parse_number(request.query, "io_fraction", 0.0, 1.0, default=0.4)
    oops_fraction = work.parse_number(request.query, "oops_fraction", 0.0, 1.0, default=0.0)
    ms = _ms(request)
    draw = random.random()
    if draw < io_fraction * oops_fraction:
        request[_IO_MS] += work.wait_io_blocking(ms)
        return web.Response(text="ok oops\n")
    if draw < io_fraction:
        await _await_io(request, ms)
        return web.Response(text="ok io\n")
    work.burn_cpu(None)
    return web.Response(text="ok cpu\n")


async def mystery(request):
    case = work.mystery_case(request.query)
    step = work.mystery_step(case)
    work.burn_cpu(step.cpu_ms)
    if step.blocking:
        request[_IO_MS] += work.wait_io_blocking(step.io_ms)
    else:
        await _await_io(request, step.io_ms)
    return web.Response(text="ok\n")


def create_app() -> web.Application:
    """Build the aiohttp twin of the demo app, with the same Server-Timing as the Flask one."""
    app = web.Application(middlewares=[server_timing])
    app.router.add_get("/health", health)
    app.router.add_get("/io", io)
    app.router.add_get("/cpu", cpu)
    app.router.add_get("/oops", oops)
    app.router.add_get("/mixed", mixed)
    app.router.add_get("/mystery", mystery)
    return app
