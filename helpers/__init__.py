"""Helpers for the web-performance course: what the notebooks import.

The handful of names a learner uses, and the lesson that introduces each:

  DemoServer        start/stop the demo app under gunicorn, a dev server or aiohttp   (lesson 00)
  stop_all          stop every server this kernel started                             (lesson 00)
  running           list course servers alive on this machine, from any kernel        (lesson 00)
  machine           effective cores, memory limit, versions, Binder or not            (lesson 00)
  run_load          fire closed-loop, burst or open-loop load; returns a Run           (lesson 01)
  load_run          read a saved Run back from data/runs/                              (lesson 01)
  sweep             a grid of server configs x load points, one row each               (lesson 03)
  load_reference    reference sweeps measured on a 2-core machine                      (lesson 04)

Modules by topic: helpers.plots (figures), helpers.theory (Little's law, CPU ceiling, USL),
helpers.lesson (quick mode, self-checks), helpers.clients (client-side comparison, lesson 06).
From a terminal: python -m helpers {serve,load,doctor,record-reference}.
"""

from helpers.server import DemoServer, ServerStartError, running, stop_all

__all__ = ["DemoServer", "ServerStartError", "running", "stop_all", "machine", "run_load", "Run", "load_run",
           "list_runs", "sweep", "load_reference"]

# Imported on first use: gunicorn's master imports this package (for its hooks), and must not
# pay for pandas and numpy.
_LAZY = {"machine": "helpers.machine", "run_load": "helpers.load", "Run": "helpers.load",
         "load_run": "helpers.load", "list_runs": "helpers.load", "sweep": "helpers.sweep",
         "load_reference": "helpers.sweep"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
