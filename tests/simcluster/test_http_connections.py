"""Connections to the simulated cluster, as clients see them: one kept-alive HTTP/1.1
connection carries request after request (a paged LIST's pages, a controller's reads),
a request body the server did not need never spills into the next request, streams
(watches) and chunked request bodies end their connection, and stopping the server ends
the connections left open."""
from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlsplit

from simcluster.kubeconfig import ADMIN_TOKEN

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "application/json"}


def _connect(kube) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(urlsplit(kube.url).netloc, timeout=10)


def _ask(connection, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         **options) -> tuple[http.client.HTTPResponse, bytes]:
    connection.request(method, path, body=body, headers={**HEADERS, **(headers or {})}, **options)
    response = connection.getresponse()
    return response, response.read()


def test_pages_and_other_reads_go_over_one_kept_alive_connection(kube):
    for n in range(5):
        kube.core.create_namespaced_pod("team-a", {"metadata": {"name": f"p{n}"},
                                                   "spec": {"containers": [{"name": "c", "image": "x"}]}})
    connection = _connect(kube)
    response, body = _ask(connection, "GET", "/api/v1/pods?limit=2")
    first_socket = connection.sock
    assert first_socket is not None, "the server closed the connection after a response"
    names, token = [p["metadata"]["name"] for p in json.loads(body)["items"]], json.loads(body)["metadata"]["continue"]
    while token:
        response, body = _ask(connection, "GET", f"/api/v1/pods?limit=2&continue={token}")
        assert response.status == 200 and response.getheader("Connection") != "close"
        names += [p["metadata"]["name"] for p in json.loads(body)["items"]]
        token = json.loads(body)["metadata"].get("continue")
    response, body = _ask(connection, "GET", "/api/v1/nodes/gpu-1")
    assert (response.status, json.loads(body)["metadata"]["name"]) == (200, "gpu-1")
    response, body = _ask(connection, "GET", "/version")
    assert response.status == 200 and "gitVersion" in json.loads(body)
    assert names == [f"p{n}" for n in range(5)]
    assert connection.sock is first_socket   # never reconnected
    connection.close()


def test_a_request_body_the_server_did_not_read_does_not_spill_into_the_next_request(kube):
    connection = _connect(kube)
    # Refused before the body is read (no such resource; then no such token): the body
    # still comes off the connection before the next request is read.
    body = json.dumps({"metadata": {"name": "x" * 100_000}}).encode()
    response, answer = _ask(connection, "POST", "/api/v1/namespaces/team-a/nosuchthings", body,
                            {"Content-Type": "application/json"})
    assert response.status == 404
    response, answer = _ask(connection, "POST", "/api/v1/namespaces/team-a/pods", body,
                            {"Content-Type": "application/json", "Authorization": "Bearer not-a-token"})
    assert response.status == 401
    response, answer = _ask(connection, "GET", "/api/v1/namespaces/team-a")
    assert (response.status, json.loads(answer)["metadata"]["name"]) == (200, "team-a")
    assert connection.sock is not None
    connection.close()


def test_a_chunked_request_body_is_read_and_its_connection_closes(kube):
    connection = _connect(kube)
    pod = json.dumps({"metadata": {"name": "sent-in-chunks"},
                      "spec": {"containers": [{"name": "c", "image": "x"}]}}).encode()
    response, answer = _ask(connection, "POST", "/api/v1/namespaces/team-a/pods", iter([pod[:20], pod[20:]]),
                            {"Content-Type": "application/json"}, encode_chunked=True)
    assert response.status == 201 and json.loads(answer)["metadata"]["name"] == "sent-in-chunks"
    assert response.getheader("Connection") == "close"
    assert kube.core.read_namespaced_pod("sent-in-chunks", "team-a").metadata.name == "sent-in-chunks"


def test_a_watch_streams_its_events_then_ends_its_connection(kube):
    connection = _connect(kube)
    response, answer = _ask(connection, "GET", "/api/v1/nodes?watch=true&timeoutSeconds=1")
    assert response.status == 200
    assert (response.getheader("Transfer-Encoding"), response.getheader("Connection")) == ("chunked", "close")
    events = [json.loads(line) for line in answer.splitlines()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "gpu-1"), ("ADDED", "gpu-2")]
    assert connection.sock is None   # the client saw the connection end with the stream


def test_stopping_the_server_ends_a_connection_left_open(kube):
    connection = _connect(kube)
    response, _ = _ask(connection, "GET", "/api/v1/nodes")
    assert response.status == 200
    kept = connection.sock
    kube.server.stop()
    kept.settimeout(10)
    try:
        ended = kept.recv(1) == b""
    except ConnectionResetError:
        ended = True
    except socket.timeout:
        ended = False
    assert ended, "the connection stayed open after the server stopped"
    connection.close()


def test_a_list_sent_in_pieces_arrives_whole_and_the_connection_serves_the_next_request(kube_factory):
    from simcluster.generate import generate
    docs = generate(nodes=20, pods=1000, seed=5)[1:]
    pods = sorted((d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "Pod")
    kube = kube_factory(docs)
    connection = _connect(kube)
    response, body = _ask(connection, "GET", "/api/v1/pods")
    assert len(body) > 2 * (1 << 18)   # more than two of the pieces a large LIST goes out in
    assert int(response.getheader("Content-Length")) == len(body)
    listed = json.loads(body)
    assert listed["kind"] == "PodList"
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in listed["items"]] == pods
    response, body = _ask(connection, "GET", "/api/v1/pods?limit=150")
    page = json.loads(body)
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in page["items"]] == pods[:150]
    assert page["metadata"]["remainingItemCount"] == len(pods) - 150
    assert connection.sock is not None
    connection.close()
