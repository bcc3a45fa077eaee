"""PrometheusSignals' I/O edges against real HTTP servers on loopback: errors, timeouts, credentials.

A real Prometheus is exercised in ``e2e/test_prometheus_signals_e2e.py``; here small servers
answer the query API badly on purpose.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest

from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.dev.net import free_port
from rolloutpool.metrics.prom import PrometheusSignals, PrometheusUnreachable, redact_url, scrub
from rolloutpool.metrics.promql import QUERY_NAMES

USER, PASSWORD = "scraper", "s3cr%t-pass"
NOW = 1_800_000_000.0


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    delay: float = 0.0


@dataclass
class FakeApi:
    """What the server answers and what it saw."""

    url: str
    respond: Callable[[str], Answer]
    queries: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # server_close joins every handler thread: nothing leaks


@pytest.fixture
def fake_api() -> Iterator[Callable[[Callable[[str], Answer]], FakeApi]]:
    """Start a query-API server whose answers a test chooses; always stopped, threads joined."""
    servers: list[tuple[_Server, threading.Thread, FakeApi]] = []

    def start(respond: Callable[[str], Answer]) -> FakeApi:
        api = FakeApi(url="", respond=respond)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
                api.queries.append(query)
                api.authorizations.append(self.headers.get("Authorization"))
                answer = api.respond(query)
                if answer.delay:
                    api.release.wait(answer.delay)
                with contextlib.suppress(OSError):  # the client may have given up already
                    self.send_response(answer.status)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = _Server(("127.0.0.1", 0), Handler)
        api.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread, api))
        return api

    yield start
    for server, thread, api in servers:
        api.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def success(result: list[dict[str, object]]) -> Answer:
    return Answer(body=json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode())


def test_redact_url_drops_credentials_query_and_fragment() -> None:
    assert redact_url("https://u:p@prom.example:9090/prom/?token=x#f") == "https://prom.example:9090/prom"
    assert redact_url("http://[::1]:9090") == "http://[::1]:9090"
    assert redact_url("http://host:notaport") == "<unparsable URL>"


def test_scrub_replaces_longest_secret_first() -> None:
    assert scrub("user=ab pass=abc", ["ab", "abc", ""]) == "user=*** pass=***"


def test_rejects_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="http") as err:
        PrometheusSignals(f"ftp://{USER}:{PASSWORD}@host")
    assert PASSWORD not in str(err.value)


def test_connection_refused_is_unreachable_at_once_and_shows_no_credentials() -> None:
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}/"
    with PrometheusSignals(url, timeout_seconds=5.0) as reader:
        assert reader.url == f"http://127.0.0.1:{urlsplit(url).port}"
        started = time.monotonic()
        with pytest.raises(PrometheusUnreachable) as err:
            reader.read(namespace="ns", replicas=["a"], window_seconds=30)
        elapsed = time.monotonic() - started
    message = str(err.value)
    assert "refused" in message
    assert reader.url in message
    for secret in (USER, PASSWORD, "s3cr%25t"):
        assert secret not in message
    assert err.value.__cause__ is None
    assert err.value.__suppress_context__
    assert elapsed < 2.0, "no retries with back-off: a failed read is reported at once"


def test_basic_auth_from_the_url_is_sent_and_the_answer_parsed(fake_api: Callable[..., FakeApi]) -> None:
    def respond(query: str) -> Answer:
        if query.startswith("max by (pod) (vllm:kv_cache_usage_perc"):
            return success([{"metric": {"pod": "a"}, "value": [NOW, "0.5"]}])
        return success([])

    api = fake_api(respond)
    netloc = urlsplit(api.url).netloc
    with PrometheusSignals(f"http://{USER}:s3cr%25t-pass@{netloc}") as reader:
        signals = reader.read(namespace="ns", replicas=["a", "b"], window_seconds=30)
    assert signals == {"a": ReplicaSignals(kv_usage=0.5), "b": None}
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert set(api.authorizations) == {expected}
    assert len(api.queries) == len(QUERY_NAMES), "one query per signal, whatever the number of replicas"


def test_no_replicas_sends_no_query(fake_api: Callable[..., FakeApi]) -> None:
    api = fake_api(lambda _q: success([]))
    with PrometheusSignals(api.url) as reader:
        assert reader.read(namespace="ns", replicas=[], window_seconds=30) == {}
    assert api.queries == []


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Answer(status=503, body=b"overloaded"), "answered with an error: HTTP Status Code 503"),
        (Answer(status=422, body=b'{"status":"error","error":"bad query"}'), "HTTP Status Code 422"),
        (Answer(body=b"<html>not prometheus</html>"), "not a query result"),
        (Answer(body=b'{"status":"success","data":{}}'), "not a query result"),
        (Answer(body=b'{"status":"success","data":{"result":[1,2]}}'), "not a query result"),
    ],
)
def test_bad_answers_are_unreachable(fake_api: Callable[..., FakeApi], answer: Answer, expected: str) -> None:
    api = fake_api(lambda _q: answer)
    url = f"http://{USER}:{PASSWORD}@{urlsplit(api.url).netloc}"
    with PrometheusSignals(url) as reader, pytest.raises(PrometheusUnreachable, match=expected) as err:
        reader.read(namespace="ns", replicas=["a"], window_seconds=30)
    assert PASSWORD not in str(err.value)
    assert len(api.queries) == 1, "the read stops at the first failed query"


def test_a_hanging_server_times_out_within_the_read_budget(fake_api: Callable[..., FakeApi]) -> None:
    api = fake_api(lambda _q: Answer(delay=30.0))
    with PrometheusSignals(api.url, timeout_seconds=0.5) as reader:
        started = time.monotonic()
        with pytest.raises(PrometheusUnreachable, match=r"did not answer within 0\.5s"):
            reader.read(namespace="ns", replicas=["a"], window_seconds=30)
        assert time.monotonic() - started < 3.0


def test_the_timeout_bounds_the_whole_read(fake_api: Callable[..., FakeApi]) -> None:
    # every query answers, slowly: together they exceed the budget
    api = fake_api(lambda _q: Answer(delay=0.2, body=success([]).body))
    with PrometheusSignals(api.url, timeout_seconds=0.5) as reader:
        started = time.monotonic()
        with pytest.raises(PrometheusUnreachable, match=r"did not answer (every query )?within"):
            reader.read(namespace="ns", replicas=["a"], window_seconds=30)
        assert time.monotonic() - started < 2.0
    assert 1 < len(api.queries) < 9


def test_reads_from_several_threads_take_turns(fake_api: Callable[..., FakeApi]) -> None:
    def respond(query: str) -> Answer:
        if query.startswith("max by (pod) (vllm:kv_cache_usage_perc"):
            return success([{"metric": {"pod": "a"}, "value": [NOW, "0.25"]}])
        return success([])

    api = fake_api(respond)
    with PrometheusSignals(api.url) as reader, ThreadPoolExecutor(max_workers=8) as pool:
        reads = [pool.submit(reader.read, namespace="ns", replicas=["a"], window_seconds=30) for _ in range(16)]
        assert all(r.result(timeout=30) == {"a": ReplicaSignals(kv_usage=0.25)} for r in reads)
    assert len(api.queries) == 16 * len(QUERY_NAMES)
