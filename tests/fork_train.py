"""A launcher of `capo-trl train` runs for tests that kill many of them: it imports the CLI once, then
forks one process per run, so a run starts in about a second instead of ten (the imports).

Each child is a process of its own (its own session, so a SIGKILL of its group takes everything it
started) that runs ``capo_trl.cli.main.main(["train", *argv])``, the entry point of the ``capo-trl``
command, with stdout and stderr in a log file, and exits with its status like the command would.

Protocol, one JSON line per run on stdin: ``{"argv": [...], "log": PATH}``; it answers ``pid PID`` at
once the child leads its own process group and ``exit STATUS`` (negative: killed by that signal) when the run
ends. An empty line stops it.
Start it with ``OMP_NUM_THREADS=1`` (as every run it is compared with): no torch op runs here before
a fork, so each child sets up its own thread pool.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import traceback

ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's own channel; what libraries print goes to stderr
os.dup2(2, 1)

from capo_trl.cli import main as cli  # noqa: E402
import capo_trl.cli.train  # noqa: F401,E402  (the heavy imports: torch, transformers, TRL, datasets)
import capo_trl.training.trainer  # noqa: F401,E402

if importlib.util.find_spec("deepspeed"):  # accelerate imports it on the first is_peft_model call
    import deepspeed  # noqa: F401


def child(argv: list[str], fd: int, ready: int) -> int:
    os.setsid()
    os.write(ready, b"1")  # its group exists now: a SIGKILL of the group can no longer miss it
    os.close(ready)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        status = cli.main(["train", *argv])
    except SystemExit as end:
        status = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # what Python prints for an uncaught exception, and its status
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return status or 0


def serve() -> None:
    gc.freeze()  # what was imported stays out of the children's collections (accelerate calls gc.collect())
    for line in sys.stdin:
        if not line.strip():
            return
        job = json.loads(line)
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # there before the pid is told
        wait, ready = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(wait)
            os._exit(child(job["argv"], fd, ready))
        os.close(fd)
        os.close(ready)
        os.read(wait, 1)  # the pid is told once the child leads its own group (before, killpg finds no group)
        os.close(wait)
        print(f"pid {pid}", file=ANSWERS)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"exit {code}", file=ANSWERS)


if __name__ == "__main__":
    serve()
