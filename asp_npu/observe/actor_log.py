"""Per-actor log files: each rollout instance's and trainer rank's output in `<run_dir>/logs/<actor>.log`.

vLLM, Ray, torch and megatron-core write to the actor process's stdout/stderr (Python logging
handlers, warnings, C++ code alike). A run starts Ray with `redirect` as the job's worker-process
setup hook (Ray's `worker_process_setup_hook`) and `log_to_driver=False`; an actor whose runtime_env
names a file in `LOG_ENV` gets its process's file descriptors 1 and 2 pointed at that file before its
class is built, so everything it and its children (vLLM's engine-core process) print lands there,
appended across restarts. The driver's console keeps the progress line, failures and recoveries.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG_ENV = "ASP_ACTOR_LOG"
LOGS = "logs"
SETUP_HOOK = "asp_npu.observe.actor_log.redirect"


def log_path(run_dir: str | Path, actor: str) -> Path:
    """`<run_dir>/logs/<actor>.log` (absolute: actors run in other working directories)."""
    return Path(run_dir).resolve() / LOGS / f"{actor}.log"


def with_log(options: dict[str, Any], path: Path) -> dict[str, Any]:
    """Ray actor `options` whose runtime_env sends the actor's output to `path`."""
    env = dict(options.get("runtime_env") or {})
    env["env_vars"] = {**env.get("env_vars", {}), LOG_ENV: str(path)}
    return {**options, "runtime_env": env}


def redirect() -> None:
    """Worker-process setup hook: stdout and stderr (the descriptors, so C++ output and child
    processes follow) to the file in `LOG_ENV`; a worker without it keeps Ray's own log files."""
    target = os.environ.get(LOG_ENV)
    if not target:
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


class DriverRayLog:
    """Ray's own driver-side messages (start-up notices, warnings about actors the fleet kills) go to
    `<run_dir>/logs/ray-driver.log` while a run holds Ray; `restore` puts Ray's handlers back.

    `ray.init(configure_logging=False)` clears the "ray" logger's handlers while it starts, so the file
    is also attached to "ray._private" (where start-up messages come from) and `attach` is called
    again once Ray is up."""

    LOGGERS = ("ray", "ray._private")

    def __init__(self, path: Path) -> None:
        import logging

        path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
                      for n in self.LOGGERS}
        self.attach()

    def attach(self) -> None:
        import logging

        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            for h in list(lg.handlers):
                if h is not self.handler:
                    lg.removeHandler(h)
            if self.handler not in lg.handlers:
                lg.addHandler(self.handler)
            lg.propagate = False

    def restore(self) -> None:
        import logging

        for name, (handlers, propagate) in self.saved.items():
            lg = logging.getLogger(name)
            lg.removeHandler(self.handler)
            for h in handlers:
                lg.addHandler(h)
            lg.propagate = propagate
        self.handler.close()
