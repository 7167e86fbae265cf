"""Answers Prometheus should never give, and a token that cannot go into a header: a clear
`PrometheusError`, never a traceback; a run that meets one is recorded failed, saying why."""
from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from django.core.management import CommandError, call_command

from clusters.errors import PrometheusError, is_transient
from clusters.models import Cluster
from clusters.prometheus import PrometheusGateway
from pruning.models import PruneRun
from pruning.services import PruneParams, prune_run_execute

from pruning_world import World

CENSUS_OK = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@pytest.fixture
def answering():
    """A fake Prometheus: `set(candidates_body, census_body)`; the census query is told by
    its `group by`. Returns (url, set)."""
    bodies = {"candidates": CENSUS_OK, "census": CENSUS_OK}

    class Fake(BaseHTTPRequestHandler):
        def do_GET(self):   # a range query: the candidates' body
            self._answer(bodies["candidates"])

        def do_POST(self):
            form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
            query = form.get("query", [""])[0]
            self._answer(bodies["census" if "group by" in query else "candidates"])

        def _answer(self, body: bytes):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def set_bodies(candidates: bytes, census: bytes = CENSUS_OK):
        bodies.update(candidates=candidates, census=census)

    yield f"http://127.0.0.1:{server.server_address[1]}", set_bodies
    server.shutdown()


MALFORMED = [
    (b'{"data":null}', "no data object"),
    (b'{"data":{"result":"abc"}}', "not a list of series"),
    (b"[1,2]", "no data object"),
    (b'{"data":{"result":[{"metric":{"pod":"p"}}]}}', "without a [time, value] pair"),
    (b'{"data":{"result":[{"metric":{},"value":[1700000000,"xyz"]}]}}', "'xyz' at 1700000000 is not a number"),
    (b'{"data":{"result":[{"metric":{},"value":"1"}]}}', "without a [time, value] pair"),
    (b'{"data":{"resultType":"scalar","result":[1700000000,"1"]}}', "'scalar' result"),
    (b"<html>proxy error</html>", "the body is not JSON"),
]


@pytest.mark.parametrize("body,says", MALFORMED)
def test_a_malformed_answer_is_a_clear_refusal(answering, body, says):
    url, set_bodies = answering
    set_bodies(body)
    with pytest.raises(PrometheusError) as caught:
        PrometheusGateway(url, retries=0).query("up")
    assert str(caught.value).startswith("unexpected answer from Prometheus: ") and says in str(caught.value)
    assert not is_transient(caught.value)


@pytest.mark.parametrize("body,says", [
    (b'{"status":"success","data":null}', "TypeError"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"x"]]}]}}',
     "a range sample [1, 'x'] is no [time, value] pair of numbers"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}}]}}',
     "a range series without labels and values"),
])
def test_a_malformed_range_answer_is_a_clear_refusal(answering, body, says):
    from datetime import datetime, timedelta, timezone

    url, set_bodies = answering
    set_bodies(body)
    end = datetime.now(timezone.utc)
    with pytest.raises(PrometheusError, match="unexpected answer from Prometheus") as caught:
        PrometheusGateway(url, retries=0).query_range("up", start=end - timedelta(minutes=5), end=end, step="60s")
    assert says in str(caught.value)


@pytest.mark.django_db
@pytest.mark.parametrize("candidates,census,says", [
    (b'{"data":null}', CENSUS_OK, "no data object"),
    (b'{"data":{"result":[{"metric":{},"value":[1700000000,"xyz"]}]}}', CENSUS_OK, "is not a number"),
    (CENSUS_OK, b'{"data":{"result":[{"metric":{"namespace":"team-a"},"value":[1700000000,"NaN"]}]}}',
     "the census counted nan GPU pods in namespace 'team-a', not a whole number"),
])
def test_a_run_that_meets_one_is_recorded_failed_with_the_reason(tmp_path, answering, candidates, census, says):
    url, set_bodies = answering
    set_bodies(candidates, census)
    with World.start(tmp_path, nodes=1) as world:
        with pytest.raises(PrometheusError, match="unexpected answer from Prometheus"):
            prune_run_execute(kube_gateway=world.gateway, prometheus=PrometheusGateway(url, retries=0),
                              now=world.now(), params=PruneParams(run_mode="scale-down"))
    run = PruneRun.objects.get()
    assert run.status == "failed" and run.lease_expires_at is None
    assert len(run.errors) == 1 and run.errors[0].startswith("refused: unexpected answer from Prometheus")
    assert says in run.errors[0]


SECRET = "eyJhbGciOi-secret-part"


@pytest.mark.parametrize("token", [f"{SECRET}\n", f"{SECRET}\r\nX-Injected: 1", f" {SECRET}", f"{SECRET}é"])
def test_a_token_that_cannot_go_into_a_header_is_refused_without_quoting_it(token):
    with pytest.raises(PrometheusError) as caught:
        PrometheusGateway("http://127.0.0.1:9", token=token)
    assert "the Prometheus token holds characters not allowed in a header" in str(caught.value)
    assert SECRET not in str(caught.value) and not is_transient(caught.value)


@pytest.mark.django_db
def test_the_command_refuses_such_a_token_before_any_run(monkeypatch):
    Cluster.objects.create(name="sim", kubeconfig_path="/nonexistent/kubeconfig",
                           prometheus_url="http://127.0.0.1:9", prometheus_token_env="PROM_TOKEN_UNDER_TEST")
    for args, env in (([], f"{SECRET}\n"), (["--prometheus-token", f"{SECRET}\nmore"], None)):
        if env:
            monkeypatch.setenv("PROM_TOKEN_UNDER_TEST", env)
        out, err = io.StringIO(), io.StringIO()
        with pytest.raises(CommandError) as caught:
            call_command("prune", "--cluster", "sim", *args, stdout=out, stderr=err)
        assert "the Prometheus token holds characters not allowed in a header" in str(caught.value)
        assert SECRET not in str(caught.value) + out.getvalue() + err.getvalue()
    assert not PruneRun.objects.exists()
