"""/docs and /redoc: the pages and every asset they load come from the service itself."""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.app.api.playground.test_page import AssetLinks

EXPECTED_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture(scope="module")
def docs_client(service_settings: Settings) -> TestClient:
    # No lifespan: the pages need neither the model nor the artifact.
    return TestClient(create_app(service_settings))


def page_assets(client: TestClient, page: str) -> list[str]:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    links = AssetLinks()
    links.feed(response.text)
    return links.urls


@pytest.mark.parametrize(("page", "script"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_page_loads_only_assets_the_service_serves(docs_client: TestClient, page: str, script: str) -> None:
    urls = page_assets(docs_client, page)
    assert any(url.endswith(script) for url in urls), urls
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{page} loads {url} from elsewhere"
        asset = docs_client.get(urljoin("http://testserver/", url))
        assert asset.status_code == 200, url
        assert EXPECTED_TYPES[url[url.rfind(".") :]] in asset.headers["content-type"], url
        assert len(asset.content) > 1000, url


def test_swagger_ui_reads_the_served_schema(docs_client: TestClient) -> None:
    html = docs_client.get("/docs").text
    assert "url: '/openapi.json'" in html
    schema = docs_client.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    # Swagger UI 5 is the first major version that renders OpenAPI 3.1.
    bundle = docs_client.get("/docs/static/swagger-ui-bundle.js").text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.\d+\.\d+"', bundle)
    assert version is not None and int(version.group(1)) >= 5
    assert "/docs" not in schema["paths"] and "/redoc" not in schema["paths"]


def test_links_carry_the_proxy_prefix(service_settings: Settings) -> None:
    client = TestClient(create_app(service_settings), root_path="/tad")
    urls = page_assets(client, "/docs")
    assert urls and all(url.startswith("/tad/docs/static/") for url in urls), urls
    assert "url: '/tad/openapi.json'" in client.get("/docs").text
    assert all(url.startswith("/tad/docs/static/") for url in page_assets(client, "/redoc"))


def test_a_refused_byte_range_gets_the_error_shape(docs_client: TestClient) -> None:
    response = docs_client.get("/docs/static/swagger-ui.css", headers={"Range": "bytes=5-2"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "Range"
