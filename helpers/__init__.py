"""Helpers for the web-performance course: what the notebooks import.

The handful of names a learner uses (each docstring names the lesson that introduces it):

  DemoServer   start/stop the demo app under gunicorn (lesson 00)
  stop_all     stop every server this kernel started (lesson 00)
  running      list course servers alive on this machine (lesson 00)
"""

from helpers.server import DemoServer, ServerStartError, running, stop_all

__all__ = ["DemoServer", "ServerStartError", "running", "stop_all"]
