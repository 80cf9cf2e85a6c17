"""The image's HEALTHCHECK: is this container's motley process doing its job?

web: the ASGI server answers HTTP (any status below 500: the API's 401 to an anonymous call counts).
worker: the Celery worker answers a ping through the broker, so it consumes control tasks.
beat, agent and one-off commands have no check of their own here: an agent's health is what the
control plane sees of it (its node READY, SUSPECT or LOST from heartbeats), and beat's is the
work it schedules. Exit 0 healthy, 1 not (Docker's convention); the reason goes to stdout.
"""

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request


def web() -> str | None:
    url = f"http://127.0.0.1:{os.environ.get('MOTLEY_HTTP_PORT', '8000')}/api/v1/"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        return f"{url}: {exc}"
    return None if status < 500 else f"{url}: HTTP {status}"


def worker() -> str | None:
    node = f"celery@{socket.gethostname()}"
    result = subprocess.run(
        ["celery", "-A", "controlplane.celery", "inspect", "ping", "--destination", node, "--timeout", "5"],
        capture_output=True, text=True, timeout=25, cwd="/opt/motley/app",
    )
    return None if result.returncode == 0 else f"{node} did not answer a ping: {result.stdout}{result.stderr}"


def main() -> int:
    try:
        with open("/tmp/motley-role") as role_file:
            role = role_file.read().strip()
    except OSError:
        print("the entrypoint has not started a command yet")
        return 1
    check = {"web": web, "worker": worker}.get(role)
    if check is None:
        print(f"{role}: no check inside the container (see docker/healthcheck.py)")
        return 0
    problem = check()
    print(problem or f"{role}: healthy")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
