"""Run as a script: load a stage and print, as JSON, the peak anonymous memory loading took.

Anonymous memory (RssAnon) is what the process owns; the pages safetensors maps from the checkpoint
are page cache, shared and reclaimable, so they are not counted. The test runs this with
MALLOC_MMAP_THRESHOLD_ set low, so freed blocks go back to the kernel and RSS tracks live tensors.

    python peak_load_memory.py MODEL_DIR START END BITS
"""

import ctypes
import gc
import json
import sys
import threading
import time

import torch

from contracts.precision import Precision
from worker_runtime import Stage


def rss_anon() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    path, start, end, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    # imports and kernel probes outside the measurement
    Stage.load(path, 0, 1, precision=Precision(bits), kv_tokens=16)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base, peak, done = rss_anon(), [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_anon())
            time.sleep(0.0001)

    thread = threading.Thread(target=poll)
    thread.start()
    stage = Stage.load(path, start, end, precision=Precision(bits), kv_tokens=64)
    done.set()
    thread.join()
    peak_bytes = max(peak[0], rss_anon()) - base
    print(json.dumps({"peak": peak_bytes, "stage": stage.memory().total_bytes}))


if __name__ == "__main__":
    main()
