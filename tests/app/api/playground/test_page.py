"""The playground page at `/`: same-origin assets only, its static files, and the report PNG route."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from app.api.playground import STATIC_DIR
from app.settings import Settings
from tests.app.api.playground.conftest import PNG
from tests.app.api.test_errors import assert_error
from tests.app.service_client import make_client

SVG_NAMESPACE = "http://www.w3.org/2000/svg"


class AssetLinks(HTMLParser):
    """Every URL the page makes the browser load: scripts, stylesheets, images, frames."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.urls.append(value)


@pytest.fixture(scope="module")
def page_client(service_settings: Settings, artifact_with_report: Path) -> Iterator[TestClient]:
    with make_client(service_settings, artifact_dir=artifact_with_report) as client:
        yield client


def test_root_serves_html_with_same_origin_assets_only(page_client: TestClient) -> None:
    response = page_client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in response.headers["content-security-policy"]
    links = AssetLinks()
    links.feed(response.text)
    assert len(links.urls) >= 3  # the stylesheet, the module, the fallback script
    for url in links.urls:
        parts = urlsplit(url)
        if parts.scheme == "data":  # inline (the empty favicon): nothing is fetched
            continue
        assert not parts.scheme and not parts.netloc, f"{url} is not same-origin"
        asset = page_client.get(urljoin("http://testserver/", url))
        assert asset.status_code == 200, url
        expected = "text/css" if url.endswith(".css") else "javascript"
        assert expected in asset.headers["content-type"], url


def test_every_static_file_is_served_and_loads_nothing_from_elsewhere(page_client: TestClient) -> None:
    files = sorted(path.name for path in STATIC_DIR.iterdir() if path.is_file())
    assert {"index.html", "app.js", "style.css"} <= set(files)
    for name in files:
        response = page_client.get(f"/playground/static/{name}")
        assert response.status_code == 200, name
        assert response.headers["cache-control"] == "no-cache", name  # no stale module after an upgrade
        # index.html is reachable here too: as at "/", it may not be framed, and no file is sniffed as another type.
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"], name
        assert response.headers["x-content-type-options"] == "nosniff", name
        unchanged = page_client.get(f"/playground/static/{name}", headers={"If-None-Match": response.headers["etag"]})
        assert unchanged.status_code == 304, name
        # No CDN: the only absolute URL any asset holds is the SVG namespace (an identifier, never fetched).
        assert set(re.findall(r"https?://[^\s\"'`)]+", response.text)) <= {SVG_NAMESPACE}, name
    for source in STATIC_DIR.glob("*.js"):
        for imported in re.findall(r"""from\s+["']([^"']+)["']""", source.read_text()):
            assert imported.startswith("./"), f"{source.name} imports {imported}"
            assert page_client.get(f"/playground/static/{imported[2:]}").status_code == 200
    assert_error(page_client.get("/playground/static/missing.js"), 404)


def test_the_json_api_is_unaffected(page_client: TestClient) -> None:
    assert page_client.get("/health").json() == {"status": "ok"}
    info = page_client.get("/info").json()
    assert info["chat_template"] is True and info["limits"]["max_top_logprobs"] == 20
    paths = page_client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(path.startswith("/playground") for path in paths)


def test_report_lists_and_serves_only_its_pngs(page_client: TestClient) -> None:
    listing = page_client.get("/playground/report").json()
    assert listing == {"artifact": "tiny-tad", "files": ["curves/nested.png", "rejection_test.png"]}
    for name in listing["files"]:
        response = page_client.get(f"/playground/report/{name}")
        assert response.status_code == 200
        assert response.headers["content-type"] == "image/png"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.content == PNG


@pytest.mark.parametrize(
    "path",
    [
        "report.md",  # inside, but not a PNG
        "fake.png.txt",
        "missing.png",
        "curves",  # a folder
        "%2E%2E/secret.png",  # encoded dot segments reach the route undecoded by the client
        "..%2Fsecret.png",
        "curves/%2E%2E/%2E%2E/secret.png",
        "%2E%2E/manifest.json",
        "%2E%2E%2F%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "%2Fetc%2Fpasswd",
        "escape.png",  # a link to a PNG outside the folder
        "manifest-link.png",  # a .png link to something else
        "nul%00.png",
    ],
)
def test_report_refuses_traversal_and_other_files(page_client: TestClient, path: str) -> None:
    response = page_client.get(f"/playground/report/{path}")
    assert_error(response, 404)
    assert response.json()["error"]["param"] == "path"


def test_report_needs_the_api_key_when_one_is_set(service_settings: Settings, artifact_with_report: Path) -> None:
    with make_client(service_settings, artifact_dir=artifact_with_report, api_key="s3cret") as client:
        assert client.get("/").status_code == 200  # the page itself is public: it asks for the key
        assert client.get("/playground/static/app.js").status_code == 200
        assert_error(client.get("/playground/report"), 401)
        assert_error(client.get("/playground/report/rejection_test.png"), 401)
        key = {"Authorization": "Bearer s3cret"}
        assert client.get("/playground/report", headers=key).json()["files"]
        assert client.get("/playground/report/rejection_test.png", headers=key).content == PNG


def test_report_without_an_artifact_is_empty(service_settings: Settings) -> None:
    with make_client(service_settings, artifact_dir=None) as client:
        assert client.get("/playground/report").json() == {"artifact": None, "files": []}
        assert_error(client.get("/playground/report/rejection_test.png"), 404)


@pytest.mark.parametrize("path", ["/playground/static/app.js", "/playground/report/rejection_test.png"])
def test_refused_byte_ranges_get_the_error_shape_and_good_ones_still_work(page_client: TestClient, path: str) -> None:
    size = len(page_client.get(path).content)
    malformed = assert_error(
        page_client.get(path, headers={"Range": "bytes=z-"}), 400, "Range", "invalid_request_error"
    )
    assert malformed["message"].startswith("Range: ")
    past_the_end = page_client.get(path, headers={"Range": f"bytes={size + 10}-"})
    assert str(size) in assert_error(past_the_end, 416, "Range", "range_not_satisfiable")["message"]
    assert past_the_end.headers["content-range"] == f"bytes */{size}"
    partial = page_client.get(path, headers={"Range": "bytes=0-3"})
    assert partial.status_code == 206 and partial.content == page_client.get(path).content[:4]
