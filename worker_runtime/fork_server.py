"""``python -m worker_runtime.fork_server --socket-fd N``: the agent's stage fork server, one process
that has imported Python, torch and this runtime once and forks every stage process from itself.

Why: a stage process spends most of its start importing (2-4 s of CPU). Warm standby processes (one
per card, each taking one start) would hide that from the first start after they warmed, but every used
one would be followed by a new one importing again: seconds of CPU taken from the serving stages right
when a handover ends (on hosts where stages share CPUs, as emulated ones do), and a second change soon
after (a kill -9 after a move) would find the card's standby still cold. A fork costs milliseconds,
copies nothing until written, and is warm for every start, however many come at once.

Protocol, over the SOCK_SEQPACKET socket inherited as fd N: the agent sends one JSON message
``{"argv": [...], "cwd": PATH, "reaper": PID}`` with two file descriptors, the new stage's stdin and
stdout; the server answers ``{"pid": PID}`` once that stage runs as the reaper's child, or
``{"error": "..."}``. The stage then runs ``worker_runtime.serve.main(argv)`` in ``cwd``, its stderr
appended to ``cwd/stderr.log``, exactly as ``python -m worker_runtime.serve ARGV`` would, in the
server's environment (the stage environment the agent started the server with).

Why the stage is forked twice: it must be the agent's child, not the server's, so that the agent waits
for it and reads its exit code as for any process it started, and a server that dies takes no stage
with it. The agent is a child subreaper (agents/adopted.py), so the stage, whose parent exits at once,
is re-parented to it; only then does it ask for PR_SET_PDEATHSIG (which would fire on the first
parent's exit) and answer. Fork safety: the server has no Python threads and runs its warm-up on one
torch thread, so no OpenMP pool exists to be lost in the child; the child draws fresh random seeds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import random
import select
import signal
import socket
import sys
import time
import traceback

import torch

from contracts.names import FORK_SERVER_WARM_FILE

from . import serve

REPARENT_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket-fd", type=int, required=True, help="the agent's end of the request socket")
    args = parser.parse_args(argv)
    channel = socket.socket(fileno=args.socket_fd)
    torch.set_num_threads(1)  # see the module's docstring: no thread pool to lose in a forked child
    serve.warm_up()
    open(FORK_SERVER_WARM_FILE, "w").close()  # in the server's folder: the agent forks from it from now on
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 1 << 16, 2)
        except OSError:
            return 0
        if not message:  # the agent closed its end
            return 0
        try:
            reply = fork_stage(json.loads(message), fds, channel)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        channel.send(json.dumps(reply).encode())


def fork_stage(request: dict, fds: list[int], channel: socket.socket) -> dict:
    """Fork the stage ``request`` describes, with ``fds`` as its stdin and stdout, re-parented to the
    request's reaper; its pid, or why it could not start."""
    argv, cwd, reaper = [str(a) for a in request["argv"]], str(request["cwd"]), int(request["reaper"])
    if len(fds) != 2:
        raise ValueError(f"expected the stage's stdin and stdout, got {len(fds)} descriptors")
    sync_read, sync_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    first = os.fork()
    if first == 0:  # the short-lived middle process: its exit hands the stage to the reaper
        try:
            if os.fork() == 0:
                os.close(sync_read)
                _become_stage(argv, cwd, reaper, fds, sync_write, channel)
        finally:
            os._exit(0)
    os.close(sync_write)
    os.waitpid(first, 0)
    try:
        ready, _, _ = select.select([sync_read], [], [], REPARENT_TIMEOUT_S + 1)
        answer = os.read(sync_read, 64).decode() if ready else ""
    finally:
        os.close(sync_read)
    if not answer.isdigit():
        return {"error": answer or f"the stage was not re-parented to process {reaper} in time"}
    return {"pid": int(answer)}


def _become_stage(argv: list[str], cwd: str, reaper: int, fds: list[int], sync_write: int,
                  channel: socket.socket) -> None:
    """In the forked stage: wait to be the reaper's child, tie its life to the reaper, take the stage's
    streams and folder, tell the server its pid, run the stage. Never returns."""
    code = 1
    try:
        os.setsid()  # its own session and process group, as every stage (agents/processes.py)
        deadline = time.monotonic() + REPARENT_TIMEOUT_S
        while os.getppid() != reaper and time.monotonic() < deadline:
            time.sleep(0.001)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != reaper:  # not adopted by the agent (or it died meanwhile): never run unsupervised
            os.write(sync_write, f"not re-parented to process {reaper}".encode())
            os._exit(1)
        channel.close()
        os.chdir(cwd)
        stderr = os.open("stderr.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for source, target in ((fds[0], 0), (fds[1], 1), (stderr, 2)):
            os.dup2(source, target)
            os.close(source)
        os.write(sync_write, str(os.getpid()).encode())
        os.close(sync_write)
        random.seed()
        torch.seed()  # the unseeded requests' sampling draws from it: not the same draws in every stage
        sys.argv = ["worker_runtime.serve", *argv]
        code = serve.main(argv)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the stage's process must end here, with its reason on stderr
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
