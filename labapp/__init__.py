"""The course's demo web app: a Flask app factory with waiting, CPU-bound and mixed endpoints.

Run it under gunicorn with the factory as the target:

    gunicorn "labapp:create_app()" --workers 2 --threads 4

Endpoints (all GET; lesson 00 introduces them, lesson 01 reads their timing):
  /io[?ms=200]            simulated blocking I/O (yields under gevent)
  /cpu[?ms=50]            CPU-bound Python work holding the GIL
  /mixed[?io_fraction=0.4&oops_fraction=0]  the first article's mix of the two
  /oops[?ms=200]          blocking I/O that does NOT yield under gevent
  /mystery[?case=1]       the capstone's service; its profile is for the learner to find out
  /health                 cheap readiness probe

labapp.aiohttp_app is the same app on aiohttp (lesson 06).
"""

from __future__ import annotations

import os
import random

from flask import Flask, jsonify, request

from labapp import work
from labapp.timing import ServerTimingMiddleware, add_io_ms

__all__ = ["create_app"]


def create_app() -> Flask:
    """Build the demo Flask app, wrapped so every response carries Server-Timing."""
    app = Flask(__name__)

    @app.errorhandler(work.BadParameter)
    def bad_parameter(err: work.BadParameter):
        body = {"error": str(err), "parameter": err.name, "value": err.value, "allowed": err.allowed}
        return jsonify(body), 400

    def ms_arg():
        return work.parse_number(request.args, "ms", 0.0, work.MAX_MS)

    @app.get("/health")
    def health():
        return jsonify(status="ok", pid=os.getpid())

    @app.get("/io")
    def io():
        add_io_ms(request.environ, work.wait_io(ms_arg()))
        return "ok\n"

    @app.get("/cpu")
    def cpu():
        work.burn_cpu(ms_arg())
        return "ok\n"

    @app.get("/oops")
    def oops():
        add_io_ms(request.environ, work.wait_io_blocking(ms_arg()))
        return "ok\n"

    @app.get("/mixed")
    def mixed():
        io_fraction = work.parse_number(request.args, "io_fraction", 0.0, 1.0, default=0.4)
        oops_fraction = work.parse_number(request.args, "oops_fraction", 0.0, 1.0, default=0.0)
        ms = ms_arg()
        draw = random.random()
        if draw < io_fraction * oops_fraction:
            add_io_ms(request.environ, work.wait_io_blocking(ms))
            return "ok oops\n"
        if draw < io_fraction:
            add_io_ms(request.environ, work.wait_io(ms))
            return "ok io\n"
        work.burn_cpu(None)
        return "ok cpu\n"

    @app.get("/mystery")
    def mystery():
        step = work.mystery_step(work.mystery_case(request.args))
        work.burn_cpu(step.cpu_ms)
        wait = work.wait_io_blocking if step.blocking else work.wait_io
        add_io_ms(request.environ, wait(step.io_ms))
        return "ok\n"

    app.wsgi_app = ServerTimingMiddleware(app.wsgi_app)
    return app
