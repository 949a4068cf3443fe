"""Client-side helpers shared by SimServer and SimProcess: talk to /sim/* over loopback HTTP."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

__all__ = ["SimControl"]

# Loopback only: never route control calls through an environment proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SimControl:
    """Mixin: needs ``host`` and ``port``."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with _OPENER.open(request, timeout=10) as response:
            return json.loads(response.read())

    def configure(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into the live config (POST /sim/config); returns the new config."""
        result: dict[str, Any] = self._call("POST", "/sim/config", fields)
        return result

    def current_config(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/sim/config")
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/sim/stats")
        return result

    def reset(self) -> None:
        """Start config, cold model, zeroed stats."""
        self._call("POST", "/sim/reset", {})

    def unload(self) -> None:
        """Make the next generation request cold."""
        self._call("POST", "/sim/unload", {})
