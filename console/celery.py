"""The Celery app: Redis broker, JSON only, tasks discovered in every installed app.

Also the one way a request hands work to the workers (``send_soon``), and the worker's
consumer, which reconnects to a broker that came back within about a second.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from celery import Celery, Task
from celery.signals import before_task_publish, task_postrun, task_prerun
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from console import instrument, logs

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

log = logging.getLogger(__name__)

# Seconds between two attempts of a worker to reach a broker it lost: the first attempt at
# once, then 0.25 s, 0.5 s, ..., at most 1 s apart for as long as it takes. Celery's own
# consumer waits 2, 4, 6, ... s (up to 30 s), so a worker came back up to 12 s after a broker
# that was down for 6 s.
RECONNECT_INTERVAL_START_S = 0.0
RECONNECT_INTERVAL_STEP_S = 0.25
RECONNECT_INTERVAL_MAX_S = 1.0

# What a publish raises when the broker cannot be reached or answer (after the short publish
# retry policy in settings): kombu wraps the transport's errors in OperationalError; the
# others are what redis-py and the socket may raise past it.
BROKER_ERRORS: tuple[type[BaseException], ...] = (OperationalError, RedisError, OSError)

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# One line per task received and done is DEBUG; state changes are the INFO lines.
logs.TaskChatterAtDebug.install()
# A task logs under the id of the request that sent it (console.logs).
before_task_publish.connect(logs.carry_into_task, weak=False)
task_prerun.connect(logs.adopt_in_task, weak=False)
task_postrun.connect(logs.leave_task, weak=False)
# Every task is counted and timed for /metrics (console.instrument).
task_prerun.connect(instrument.task_started, weak=False)
task_postrun.connect(instrument.task_ended, weak=False)


def queue_of(task: Task) -> str | None:
    """The queue the running ``task`` came from (None: the default), for the tasks it fans
    out to: work a queue of its own starts stays on that queue."""
    return (task.request.delivery_info or {}).get("routing_key") or None


def publish(name: str, args: tuple[Any, ...]) -> None:
    """Put the task ``name(*args)`` on the broker: the one door every task sent by name goes
    through (tests catch a task here). Raises what the broker raises."""
    # Every Switchyard task ignores its result (CELERY_TASK_IGNORE_RESULT).
    app.send_task(name, args=args, ignore_result=True)


def send_now(task: Task | str, *args: Any) -> bool:
    """Enqueue ``task(*args)``; False (logged) when the broker cannot take it.

    ``task`` is a task's name (``"rollouts.tasks.advance_load"``): domain modules send their
    tasks by name and never import a task module, so imports run one way, from the tasks down
    to the domain. A task module may pass its own task. The message is the one ``delay`` sends
    (the task's routes, the request id in its headers: ``console.logs.carry_into_task``).

    Never raises for a broker outage: everything sent this way is also found by a periodic
    reconcile (beat), so a lost message only delays the work by one tick.
    """
    name = task if isinstance(task, str) else task.name
    try:
        publish(name, args)
    except BROKER_ERRORS as exc:
        log.warning("could not enqueue %s%r, the broker is unreachable (%s); the next "
                    "reconcile tick picks it up", name, args, exc)
        return False
    return True


def send_soon(task: Task | str, *args: Any) -> None:
    """Enqueue ``task(*args)`` (a task's name, as for ``send_now``) once the current
    transaction commits (at once outside one).

    The row the task works on is committed first, so a worker always finds it; a broker
    outage is logged, never raised: the request that wrote the row still succeeds.
    """
    from django.db import transaction

    transaction.on_commit(functools.partial(send_now, task, *args))


class Consumer(CeleryConsumer):
    """The worker's consumer, reconnecting to a lost broker at short, bounded intervals.

    Celery's consumer calls ``Connection.ensure_connection`` with kombu's default intervals
    (2 s, growing by 2 s, up to 30 s) and offers no setting for them; this passes ours.
    """

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RECONNECT_INTERVAL_START_S,
            interval_step=RECONNECT_INTERVAL_STEP_S,
            interval_max=RECONNECT_INTERVAL_MAX_S,
        )
        return super().ensure_connected(conn)
