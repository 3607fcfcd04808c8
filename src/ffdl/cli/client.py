"""A small HTTP client for the CLI: talks to ``FFDL_API`` with ``FFDL_TOKEN`` when set."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx


def problem_lines(detail: Any, *, fields: bool = True) -> list[str]:
    """The API's answer as lines for people: one ``field: message`` line per problem of a 4xx's
    ``[{"field", "message"}]`` list (the field left out where it names no input of the user's, like
    ``(body)``, or where ``fields`` is false), the text itself otherwise."""
    if not (isinstance(detail, list) and all(isinstance(p, dict) and "message" in p for p in detail)):
        return [str(detail)]
    return [
        f"{p['field']}: {p['message']}"
        if fields and not str(p.get("field", "(")).startswith("(")
        else p["message"]
        for p in detail
    ]


def _log_query(rank: int, tail: int, attempt: int | None) -> dict[str, str | int]:
    query: dict[str, str | int] = {"rank": rank, "tail": tail}
    if attempt:
        query["attempt"] = attempt
    return query


class ApiError(RuntimeError):
    """An answer of the API that is not a success (``status`` 0: no answer at all)."""

    def __init__(self, status: int, detail: Any) -> None:
        # a refused write (409) or a missing job (404) names no field the user gave: the message alone
        super().__init__("\n".join(problem_lines(detail, fields=status in (400, 422))))
        self.status = status
        self.detail = detail


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def _unreachable(self) -> ApiError:
        return ApiError(0, f"cannot reach the API at {self._http.base_url}: is `ffdl up` running? (FFDL_API)")

    @staticmethod
    def _refusal(response: httpx.Response) -> ApiError:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        return ApiError(response.status_code, detail)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable() from exc
        if response.status_code >= 400:
            raise self._refusal(response)
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
        """A page of jobs; ``params`` are query fields; unset: left out."""
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

    def delete(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}:delete")
        return result

    def events(self, job_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """The job's whole history after ``after_seq``, page after page."""
        events: list[dict[str, Any]] = []
        cursor: int | None = after_seq
        while cursor is not None:
            page: dict[str, Any] = self._call(
                "GET", f"/v1/jobs/{job_id}/events", params={"after_seq": cursor}
            )
            events.extend(page["events"])
            cursor = page.get("next_after_seq")
        return events

    def why(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}/why")
        return result

    def logs(self, job_id: str, rank: int, tail: int, attempt: int | None = None) -> str:
        return str(self._call("GET", f"/v1/jobs/{job_id}/logs", params=_log_query(rank, tail, attempt)))

    def follow_logs(self, job_id: str, rank: int, tail: int, attempt: int | None = None) -> Iterator[str]:
        """The log's tail, then its new text as the learner writes it, until the job ends."""
        params = _log_query(rank, tail, attempt) | {"follow": "true"}
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._refusal(response)
                yield from response.iter_text()
        except httpx.TransportError as exc:
            raise self._unreachable() from exc

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
