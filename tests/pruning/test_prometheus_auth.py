"""Talking to a protected Prometheus: TLS verified by default, bearer token sent, and
where the token comes from. Against the real Prometheus server."""
from __future__ import annotations

import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusters.errors import PrometheusError
from clusters.prometheus import PrometheusGateway
from pruning.services import prometheus_token

pytestmark = pytest.mark.prometheus

TOKEN = "s3cret-token"


@pytest.fixture
def self_signed(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_is_verified_by_default_and_a_ca_bundle_makes_it_trusted(prometheus_factory, self_signed):
    server = prometheus_factory(tls=self_signed)
    assert server.url.startswith("https://")
    with pytest.raises(PrometheusError, match="certificate verify failed|CERTIFICATE_VERIFY_FAILED"):
        PrometheusGateway(server.url, retries=0).query("vector(1)")
    samples = PrometheusGateway(server.url, ca_bundle=str(self_signed[0])).query("vector(1)")
    assert [s.value for s in samples] == [1.0]


@pytest.fixture
def token_proxy(prometheus_factory):
    """A real Prometheus behind a bearer-token proxy, as kube-rbac-proxy or OpenShift's
    oauth-proxy put it in production: 401 without `Authorization: Bearer TOKEN`."""
    upstream = prometheus_factory()
    seen: list[str | None] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            self._relay(None)

        def do_POST(self):
            self._relay(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def _relay(self, body):
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b"Unauthorized")
                return
            request = urllib.request.Request(upstream.url + self.path, data=body, method=self.command,
                                             headers={"Content-Type": self.headers.get("Content-Type", "")})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    status, payload = answer.status, answer.read()
            except urllib.error.HTTPError as exc:
                status, payload = exc.code, exc.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{proxy.server_address[1]}", seen
    proxy.shutdown()
    proxy.server_close()


def test_the_bearer_token_is_sent_and_a_missing_one_is_a_clear_401(token_proxy):
    url, seen = token_proxy
    assert [s.value for s in PrometheusGateway(url, token=TOKEN).query("vector(1)")] == [1.0]
    assert seen[-1] == f"Bearer {TOKEN}"
    with pytest.raises(PrometheusError) as refused:
        PrometheusGateway(url).query("vector(1)")
    assert refused.value.status == 401 and url in str(refused.value)


def test_token_comes_from_the_flag_then_the_named_variable_then_the_service_account_file(tmp_path, monkeypatch):
    sa_file = tmp_path / "token"
    sa_file.write_text("from-service-account\n")
    monkeypatch.setenv("PROM_TOKEN", "from-env")
    assert prometheus_token(explicit="from-flag", env_name="PROM_TOKEN", sa_token_file=str(sa_file)) == "from-flag"
    assert prometheus_token(explicit=None, env_name="PROM_TOKEN", sa_token_file=str(sa_file)) == "from-env"
    monkeypatch.delenv("PROM_TOKEN")
    assert prometheus_token(explicit=None, env_name="PROM_TOKEN",
                            sa_token_file=str(sa_file)) == "from-service-account"
    assert prometheus_token(explicit=None, env_name="PROM_TOKEN", sa_token_file=str(tmp_path / "none")) is None


@pytest.fixture
def other_ca(tmp_path):
    """A CA that did not sign the server's certificate."""
    cert, key = tmp_path / "other.crt", tmp_path / "other.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=another-ca", "-keyout", str(key), "-out", str(cert)], check=True,
                   capture_output=True)
    return cert


def test_a_wrong_ca_file_fails_at_once_with_a_clear_error(prometheus_factory, self_signed, other_ca):
    server = prometheus_factory(tls=self_signed)
    with pytest.raises(PrometheusError) as refused:
        PrometheusGateway(server.url, ca_bundle=str(other_ca)).query("vector(1)")
    message = str(refused.value)
    assert f"Prometheus at {server.url}: its TLS certificate is not trusted by the CA file {other_ca}" in message
    assert "certificate verify failed" in message
    assert not refused.value.transient   # refused, not retried: asking again cannot change the answer


@pytest.fixture
def tls_world(tmp_path, prometheus_factory, self_signed):
    """The simulated cluster with an idle Deployment, its history in a Prometheus serving HTTPS."""
    from pruning_world import World, deployment

    with World.start(tmp_path) as w:
        w.create(deployment("web", "team-a", util="0"))
        w.record_history(minutes=40)
        w.tls_prometheus = prometheus_factory([s for s in w.history.values() if s.samples], tls=self_signed)
        yield w


@pytest.mark.django_db
def test_the_ca_file_comes_from_the_flag_or_the_cluster_and_a_wrong_one_is_named(tls_world, self_signed, other_ca):
    import io

    from django.core.management import CommandError, call_command

    from clusters.models import Cluster

    cluster = Cluster.objects.create(name="sim", kubeconfig_path=tls_world.kubeconfig,
                                     prometheus_url=tls_world.tls_prometheus.url)
    at = tls_world.now().isoformat()

    def prune(*flags):
        out = io.StringIO()
        call_command("prune", "--cluster", "sim", "--at", at, *flags, stdout=out)
        return out.getvalue()

    # The flag: the run reads the data and finds the idle Deployment.
    assert "-> Deployment/web: would scale to zero (idle)" in prune("--prometheus-ca-file", str(self_signed[0]))
    # Without a CA file the system's CAs do not trust it, and the error says so.
    with pytest.raises(CommandError, match="its TLS certificate is not trusted by the system's trusted CAs"):
        prune()
    # The cluster's CA bundle is used when no flag is given; the flag wins over it.
    cluster.prometheus_ca_bundle = str(self_signed[0])
    cluster.save()
    assert "-> Deployment/web: would scale to zero (idle)" in prune()
    with pytest.raises(CommandError, match=f"not trusted by the CA file {other_ca}"):
        prune("--prometheus-ca-file", str(other_ca))
