"""The Host header check against DNS rebinding: loopback-bound servers answer loopback names only."""
from __future__ import annotations

import httpx
import openai
import pytest

from serve.http.host_check import allowed_host_names, host_name
from tests.harness import ServerProcess, mock_engine_cmd

PATHS = [("GET", "/health"), ("GET", "/status"), ("GET", "/metrics"), ("GET", "/v1/models"),
         ("POST", "/v1/chat/completions"), ("GET", "/no/such/path")]
CHAT = {"model": "any", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def call(server: ServerProcess, method: str, path: str, host: str) -> httpx.Response:
    body = CHAT if method == "POST" else None
    return httpx.request(method, server.url + path, json=body, headers={"Host": host}, timeout=10)


@pytest.mark.parametrize("method,path", PATHS)
def test_a_foreign_host_is_refused_on_every_path(mock_server, method, path):
    r = call(mock_server, method, path, "evil.example")
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == "host_not_allowed" and "evil.example" in error["message"]
    assert "--allowed-hosts" in error["message"]


def test_anthropic_paths_refuse_in_anthropic_shape(mock_server):
    r = httpx.post(mock_server.url + "/v1/messages", headers={"Host": "evil.example:8080"}, timeout=10,
                   json={"model": "any", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 403
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "permission_error"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "LOCALHOST."])
def test_loopback_names_with_and_without_port_are_answered(mock_server, host):
    for name in (host, f"{host}:{mock_server.port}"):
        assert call(mock_server, "GET", "/health", name).status_code == 200
    assert call(mock_server, "POST", "/v1/chat/completions", host).status_code == 200


def test_the_openai_client_sees_permission_denied(mock_server):
    client = openai.OpenAI(base_url=mock_server.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"Host": "rebound.example"})
    with pytest.raises(openai.PermissionDeniedError, match="rebound.example"):
        client.chat.completions.create(**CHAT)
    # and the server goes on answering loopback clients
    ok = openai.OpenAI(base_url=mock_server.url + "/v1", api_key="unused", max_retries=0)
    assert ok.chat.completions.create(**CHAT).choices[0].message.content


def test_allowed_hosts_adds_a_proxy_name_and_binding_wide_applies_the_list_only_when_given(server_factory):
    engine = mock_engine_cmd("--chunk-s", "0.001", "--token-s", "0.001")
    proxied = server_factory(engine_cmd=engine, extra=["--allowed-hosts", "llm.internal, proxy.example"])
    assert call(proxied, "GET", "/health", "proxy.example:443").status_code == 200
    assert call(proxied, "GET", "/health", "llm.internal").status_code == 200
    assert call(proxied, "GET", "/health", "localhost").status_code == 200
    assert call(proxied, "GET", "/health", "evil.example").status_code == 403

    wide = server_factory(engine_cmd=engine, extra=["--host", "0.0.0.0"])
    assert call(wide, "GET", "/health", "evil.example").status_code == 200  # the user chose exposure
    wide_listed = server_factory(engine_cmd=engine, extra=["--host", "0.0.0.0", "--allowed-hosts", "llm.internal"])
    assert call(wide_listed, "GET", "/health", "llm.internal").status_code == 200
    assert call(wide_listed, "GET", "/health", "evil.example").status_code == 403
    assert call(wide_listed, "GET", "/health", "localhost").status_code == 200


@pytest.mark.parametrize("header,name", [("a.example:8080", "a.example"), ("[::1]:80", "::1"), ("::1", "::1"),
                                         ("Host.Example.", "host.example"), ("127.0.0.1", "127.0.0.1")])
def test_host_name_drops_the_port_and_case(header, name):
    assert host_name(header) == name


def test_allowed_names_follow_the_bind_address():
    assert "localhost" in allowed_host_names("127.0.0.1", None)
    assert "localhost" in allowed_host_names("::1", ("x",)) and "x" in allowed_host_names("::1", ("x",))
    assert allowed_host_names("0.0.0.0", None) is None
    assert allowed_host_names("192.168.1.5", ("X.example:80",)) == {"x.example", "localhost", "127.0.0.1", "::1"}
