"""The page's files and the origin rule (serve/http/web_page.py, serve/http/origin_check.py) against the real server
over the mock engine: the page and its files are served with a policy that loads nothing from
elsewhere; a request from another page's origin (a preflight, or a simple POST that needs none) is
refused unless --cors-origin names it; the Host check covers the page and its events."""
from __future__ import annotations

import subprocess

import httpx
import pytest

from serve.http.origin_check import origin_key, same_origin
from tests.harness import PY, ROOT, ServerProcess, mock_engine_cmd

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_origins_compare_as_browsers_write_them():
    assert origin_key("HTTP://LocalHost:80/") == "http://localhost"
    assert origin_key("https://example.com:443") == "https://example.com"
    assert origin_key("http://[::1]:8080") == "http://[::1]:8080"
    assert origin_key("http://[::1]") == "http://[::1]"
    assert same_origin("http://127.0.0.1:8080", "http", "127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1:8081", "http", "127.0.0.1:8080")
    assert not same_origin("https://127.0.0.1:8080", "http", "127.0.0.1:8080")
    assert not same_origin("null", "http", "127.0.0.1:8080")


@pytest.fixture(scope="module")
def server():
    """One server with no --cors-origin, shared by the tests that only read from it."""
    with ServerProcess(engine_cmd=mock_engine_cmd()) as s:
        yield s


def test_the_page_and_its_files(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "http" not in page.text.replace("http-equiv", "")  # nothing linked from another host
    for path, kind in (("/ui/main.js", "javascript"), ("/ui/style.css", "text/css"), ("/ui/icon.svg", "svg")):
        r = httpx.get(server.url + path)
        assert r.status_code == 200 and kind in r.headers["content-type"], path
    assert httpx.get(server.url + "/ui/nothing.js").status_code == 404
    for path in ("/", "/ui/main.js", "/v1/events"):  # DNS rebinding: the page is behind the Host check too
        r = httpx.get(server.url + path, headers={"Host": "evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", path


def test_other_origins_are_refused_and_the_pages_own_is_not(server):
    url = f"{server.url}/v1/chat/completions"
    preflight = httpx.options(url, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert preflight.json()["error"]["code"] == "origin_not_allowed"
    # a form's POST needs no preflight: it is refused before it reaches the model
    simple = httpx.post(url, content=b'{"model": "m", "messages": []}',
                        headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert simple.status_code == 403 and "--cors-origin https://evil.example" in simple.json()["error"]["message"]
    events = httpx.get(f"{server.url}/v1/events", headers={"Origin": "http://localhost:3000"})
    assert events.status_code == 403
    own = httpx.post(url, json=CHAT, headers={"Origin": server.url})  # the page's own requests
    assert own.status_code == 200 and "access-control-allow-origin" not in own.headers
    assert httpx.post(url, json=CHAT).status_code == 200  # no Origin: not a browser page


def test_a_named_origin_is_allowed_with_cors_headers():
    app = "http://localhost:3000"
    with ServerProcess(engine_cmd=mock_engine_cmd(), api_key="k", extra=["--cors-origin", app]) as server:
        url = f"{server.url}/v1/chat/completions"
        preflight = httpx.options(url, headers={"Origin": app, "Access-Control-Request-Method": "POST",
                                                "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == app
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        r = httpx.post(url, json=CHAT, headers={"Origin": app, "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app
        refused = httpx.post(url, json=CHAT, headers={"Origin": app})  # the key is still needed
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == app
        assert httpx.post(url, json=CHAT, headers={"Origin": "http://localhost:3001",
                                                   "Authorization": "Bearer k"}).status_code == 403


@pytest.mark.parametrize("value", ["localhost:3000", ""])
def test_a_bad_cors_origin_is_a_clear_error(value):
    out = subprocess.run([PY, "-m", "serve", "--cors-origin", value, "--engine-cmd", mock_engine_cmd()], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--cors-origin" in out.stderr
