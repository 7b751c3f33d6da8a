"""Structured logs: every line names the request it belongs to, that id follows the request
into the Celery tasks it sends and the adapter calls they make (load, server), JSON lines on
demand, plain text by default; a log sink that fails never breaks a request."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest
from django.conf import settings
from django.test import Client
from kombu import pools as kombu_pools

from console import celery, logs
from fleet.tasks import check_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def captured():
    """The console handler as settings configure it (filter and format), writing to a buffer;
    ``captured(fmt)`` gives the buffer for format ``fmt``."""
    attached: list[logging.Handler] = []

    def attach(fmt: str) -> io.StringIO:
        buffer = io.StringIO()
        config = settings.LOGGING
        formatter = logging.config.dictConfigClass({**config, "handlers": {}, "loggers": {},
                                                    "root": {}}).configure_formatter(
            dict(config["formatters"][fmt]))
        handler = logging.StreamHandler(buffer)
        handler.setFormatter(formatter)
        handler.addFilter(logs.WithContext())
        logging.getLogger("switchyard.test").addHandler(handler)
        attached.append(handler)
        return buffer

    yield attach
    for handler in attached:
        logging.getLogger("switchyard.test").removeHandler(handler)


@pytest.mark.parametrize(("given", "kept"), [
    ("ci-run-42", True), ("9b2f0c1e-77aa-4e0b-9d1c-5b0b7f2a1c33", True),
    ("two words", False), ("line\nbreak", False), ("x" * 65, False), ("é", False), ("", False),
])
def test_a_clients_request_id_is_kept_only_when_plain(given, kept):
    made = logs.request_id_from(given)
    assert (made == given) is kept
    assert logs.PLAIN_ID.fullmatch(made)


def test_every_answer_names_its_request_id_and_echoes_a_plain_one(alice):
    client = Client()
    client.force_login(alice)
    fresh = client.get("/api/v1/models/")
    echoed = client.get("/api/v1/models/", headers={"X-Request-Id": "ci-run-42"})
    hostile = client.get("/registry/", headers={"X-Request-Id": "a\u2028b"})
    assert len(fresh["X-Request-Id"]) == 32
    assert echoed["X-Request-Id"] == "ci-run-42"
    assert hostile["X-Request-Id"] != "a\u2028b" and len(hostile["X-Request-Id"]) == 32


def test_json_lines_carry_the_request_id_and_the_subject(captured):
    out = captured("json")
    token = logs.REQUEST_ID.set("ci-run-42")
    try:
        with logs.about(load=7, server="triton"):
            logging.getLogger("switchyard.test").warning("loading v%s", 2)
    finally:
        logs.REQUEST_ID.reset(token)
    line = json.loads(out.getvalue())
    assert (line["message"], line["level"], line["logger"]) == ("loading v2", "WARNING", "switchyard.test")
    assert (line["request_id"], line["load"], line["server"]) == ("ci-run-42", 7, "triton")
    assert "time" in line


def test_plain_lines_name_them_in_brackets_and_nothing_outside_a_request(captured):
    out = captured("plain")
    log = logging.getLogger("switchyard.test")
    log.warning("outside")
    with logs.acting_for("r-1", rollout=3):
        log.warning("inside")
    first, second = out.getvalue().splitlines()
    assert first.endswith("switchyard.test: outside")
    assert second.endswith("switchyard.test: inside [request_id=r-1 rollout=3]")


def test_the_line_django_writes_after_the_answer_names_its_request(alice, captured):
    out = captured("plain")
    logging.getLogger("django.request").addHandler(logging.getLogger("switchyard.test").handlers[-1])
    try:
        client = Client()
        client.force_login(alice)
        client.get("/registry/models/999999/", headers={"X-Request-Id": "ci-run-8"})
    finally:
        logging.getLogger("django.request").removeHandler(logging.getLogger("switchyard.test").handlers[-1])
    assert "Not Found: /registry/models/999999/ [request_id=ci-run-8]" in out.getvalue()


def test_a_log_sink_that_fails_never_breaks_a_request(alice):
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("No space left on device")

    broken = logging.StreamHandler(Full())  # a sink as the standard handlers write to one
    broken.addFilter(logs.WithContext())
    logging.getLogger().addHandler(broken)
    try:
        client = Client()
        client.force_login(alice)
        answer = client.get("/api/v1/models/", {"tenant__slug": "nope", "unknown": "1"})
        refused = client.post("/api/v1/models/", {"name": "Bad Name"}, content_type="application/json")
    finally:
        logging.getLogger().removeHandler(broken)
    assert answer.status_code in (200, 400) and refused.status_code == 400


@pytest.fixture
def memory_broker():
    """This process's Celery app publishes to kombu's in-process broker for the test; yields
    the default queue, read as a worker reads it."""
    app = celery.app

    def forget_connections() -> None:
        if app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
        kombu_pools.reset()

    before = app.conf.broker_url
    forget_connections()
    app.conf.broker_url = "memory://"
    try:
        with app.connection_for_write() as connection:
            queue = connection.SimpleQueue(app.conf.task_default_queue)
            yield queue
            queue.close()
    finally:
        forget_connections()
        app.conf.broker_url = before


def test_a_task_sent_by_name_carries_the_request_id_as_delay_does(memory_broker):
    """Domain modules send tasks by name (they import no task module): the message is the one
    ``delay`` sends, with the request's id for the worker's lines."""
    with logs.acting_for("ci-run-9"):
        assert celery.send_now("fleet.tasks.check_server", 41)
        check_server.delay(41)
    by_name, by_delay = memory_broker.get(timeout=1), memory_broker.get(timeout=1)
    for message in (by_name, by_delay):
        message.ack()
    assert by_name.headers[logs.TASK_HEADER] == "ci-run-9"
    assert by_name.decode()[0] == [41] and by_name.delivery_info == by_delay.delivery_info
    differ = {"id", "root_id"}
    assert {k: v for k, v in by_name.headers.items() if k not in differ} == {
        k: v for k, v in by_delay.headers.items() if k not in differ}
