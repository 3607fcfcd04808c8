"""A small HTTP client for the CLI: talks to ``FFDL_API`` with ``FFDL_TOKEN`` when set."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, f"cannot reach the ffdl API at {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def submit(self, manifest: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/jobs", content=manifest, headers={"Content-Type": "application/yaml"}
        )
        return result

    def get(self, job_id: str, after: str | None = None) -> dict[str, Any]:
        params = {"after": after} if after else {}
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}", params=params)
        return result

    def list_jobs(self, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})
        return result

    def halt(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}:halt")
        return result

    def resume(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}:resume")
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/v1/jobs/{job_id}")
        return result

    def events(self, job_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        result: dict[str, Any] = self._call(
            "GET", f"/v1/jobs/{job_id}/events", params={"after_seq": after_seq}
        )
        return list(result["events"])

    def why(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}/why")
        return result

    def logs(self, job_id: str, rank: int, tail: int) -> str:
        return str(self._call("GET", f"/v1/jobs/{job_id}/logs", params={"rank": rank, "tail": tail}))

    def close(self) -> None:
        self._http.close()

    def nodes(self) -> list[dict[str, Any]]:
        result: dict[str, Any] = self._call("GET", "/v1/nodes")
        return list(result["nodes"])

    def node(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/nodes/{name}", params={"history": "true"})
        return result

    def cordon(self, name: str, reason: str, *, drain: bool) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/v1/nodes/{name}:cordon", json={"reason": reason, "drain": drain}
        )
        return result

    def uncordon(self, name: str, reason: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/nodes/{name}:uncordon", json={"reason": reason})
        return result
