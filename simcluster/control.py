"""`SimControl(url)`: a small HTTP client for the simulator's control endpoints.

Standard library only, so any process (tests, the demo, a shell) can drive the clock.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request


class SimControlError(RuntimeError):
    def __init__(self, code: int, message: str):
        super().__init__(f"simcluster answered {code}: {message}")
        self.code = code


class SimControl:
    def __init__(self, url: str, *, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("message", exc.reason)
            except ValueError:
                message = exc.reason
            raise SimControlError(exc.code, message) from None

    def advance(self, seconds: float = 0) -> str:
        """Advance the simulated clock, running controllers to rest; the new time (RFC 3339)."""
        return self._call("POST", "/simcluster/v1/advance", {"seconds": seconds})["now"]

    def clock(self) -> str:
        return self._call("GET", "/simcluster/v1/clock")["now"]

    def set_load(self, namespace: str, revision: str, concurrency: float) -> dict:
        return self._call("PUT", f"/simcluster/v1/load/{namespace}/{revision}", {"concurrency": concurrency})

    def set_faults(self, **faults) -> dict:
        return self._call("PUT", "/simcluster/v1/faults", faults)

    def faults(self) -> dict:
        return self._call("GET", "/simcluster/v1/faults")

    def clear_faults(self) -> dict:
        return self._call("DELETE", "/simcluster/v1/faults")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=self.timeout) as response:
            return response.read().decode()
