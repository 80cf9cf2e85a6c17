"""kombu's filesystem transport (the embedded broker) with a consumer that cannot read half a message.

kombu's writer creates a message file, then locks it, then writes it; its reader takes any file
without looking at the lock. Under load the reader takes a file before its bytes are written, fails
to decode it and the Celery worker stops with "Unrecoverable error: JSONDecodeError", the message
lost. This reader waits for the writer's lock, skips a file that is still empty or not yet valid JSON
(the next poll takes it), and claims a file by renaming it, so two consumers never both take one.
Messages written by the stock transport are read unchanged: the file format is the same.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from queue import Empty
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import loads


class Channel(filesystem.Channel):
    def _get(self, queue: str) -> Any:
        suffix = f".{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if not name.endswith(suffix):
                continue
            path = os.path.join(self.data_folder_in, name)
            try:
                with open(path, "rb") as message_file:
                    fcntl.flock(message_file.fileno(), fcntl.LOCK_SH)  # waits for a writer holding LOCK_EX
                    payload = message_file.read()
                message = loads(payload)
            except FileNotFoundError:
                continue  # another consumer took it
            except ValueError:
                continue  # created but not (fully) written yet
            claimed = f"{path}.taken-{os.getpid()}"  # same folder: an atomic rename
            try:
                os.rename(path, claimed)
            except OSError:
                continue  # another consumer claimed it first
            if self.store_processed:
                shutil.move(claimed, os.path.join(self.processed_folder, name))
            else:
                os.remove(claimed)
            return message
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
