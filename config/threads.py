"""Thread pools shared by every caller in a process, started on first use; a forked child
(a Celery worker's pool process) starts its own instead of inheriting threads that do not
exist there."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class SharedThreads:
    def __init__(self, size: int, name: str):
        self.size, self.name = size, name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix=self.name)
            return self._pool

    def _forget(self) -> None:
        self._pool, self._lock = None, threading.Lock()
