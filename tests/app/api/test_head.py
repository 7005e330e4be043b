"""HEAD wherever GET is: GET's status and headers, no body."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_head_answers_as_get_without_a_body(client: TestClient) -> None:
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/", "/playground/static/app.js"):
        got, head = client.get(path), client.head(path)
        assert got.status_code == 200 and head.status_code == 200, path
        assert head.content == b"" and got.content, path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path != "/metrics":  # its counters move with every request
            assert head.headers["content-length"] == str(len(got.content)), path


def test_head_on_a_post_only_route_is_still_refused(client: TestClient) -> None:
    response = client.head("/v1/generate")
    assert response.status_code == 405 and response.content == b""
    assert "POST" in response.headers["allow"]


def test_head_of_an_unknown_path_is_a_404(client: TestClient) -> None:
    assert client.head("/no-such-route").status_code == 404
