"""``switchyard``: the command line for CI pipelines, over the REST API (standard library only).

    switchyard rollout start --deployment ID --version N [--steps JSON] [--analysis JSON]
                             [--idempotency-key K] [--wait [--timeout S]]
    switchyard rollout status ID
    switchyard rollout wait ID [--timeout S] [--stop-when-waiting]
    switchyard rollout pause|resume|promote|abort ID [--reason TEXT]
    switchyard benchmark start --deployment ID --version N [--server S] [--levels 1,2,4]
                               [--mode concurrency|rate] [--duration-s S] [--warmup-s S]
                               [--slo JSON] [--configs JSON] [--idempotency-key K]
                               [--wait [--timeout S]]
    switchyard benchmark status ID [--json]
    switchyard benchmark wait ID [--timeout S]
    switchyard benchmark results ID
    switchyard benchmark cancel ID

The token comes from ``SWITCHYARD_TOKEN`` and the server from ``SWITCHYARD_URL`` (default
http://127.0.0.1:8000). ``wait`` (and ``start --wait``) polls every second, prints each change
of state, step and weights, and exits by how the rollout ended: 0 succeeded, 2 rolled back,
3 failed, 4 aborted, 5 still running at the timeout (or, with ``--stop-when-waiting``,
waiting for a person); 1 for a usage or HTTP error. On anything but success the reason is
printed. ``benchmark wait`` shows the job's progress on one line updated in place on a
terminal (a line per state and level otherwise, as in a CI log), then the summary, and exits 0 succeeded, 3 failed, 4 cancelled, 5 still running at the timeout, 1 for a
usage or HTTP error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

DEFAULT_URL = "http://127.0.0.1:8000"
POLL_S = 1.0
DEFAULT_TIMEOUT_S = 3600.0
REQUEST_TIMEOUT_S = 30.0

OK, ERROR, ROLLED_BACK, FAILED, ABORTED, WAITING = 0, 1, 2, 3, 4, 5
EXIT_CODES = {"succeeded": OK, "rolled_back": ROLLED_BACK, "failed": FAILED, "aborted": ABORTED}
BENCHMARK_EXIT_CODES = {"succeeded": OK, "failed": FAILED, "cancelled": ABORTED}
PEOPLE_STATES = ("paused", "pending_approval")


def say(text: str = "") -> None:
    STATUS.end()
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def warn(text: str) -> None:
    STATUS.end()
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class Refused(Exception):
    """The server answered an error (``status``), or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status == 0 or self.status == 429 or self.status >= 500

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}" if self.status else self.message


def describe_error(raw: bytes) -> str:
    """The API's error body in one line: ``detail``, or ``field: message`` per field."""
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:500] or "no answer body"
    if not isinstance(body, dict):
        return json.dumps(body)[:500]
    if "detail" in body and len(body) == 1:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)
    parts = []
    for field, messages in body.items():
        if isinstance(messages, list) and all(isinstance(m, str) for m in messages):
            parts.append(f"{field}: {' '.join(messages)}")
        else:
            parts.append(f"{field}: {json.dumps(messages)}")
    return "; ".join(parts)


class Client:
    """The API at ``base_url``, authenticated with a tenant token."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/{path.lstrip('/')}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                     "Content-Type": "application/json", "User-Agent": "switchyard-cli",
                     **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise Refused(exc.code, describe_error(exc.read())) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Refused(0, f"cannot reach {self.base_url}: {reason}") from None

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return self.call("GET", f"rollouts/{rollout_id}/")[1]

    def benchmark(self, job_id: int) -> dict[str, Any]:
        return self.call("GET", f"benchmarks/{job_id}/")[1]


# --------------------------------------------------------------------------------------------
# Showing a rollout
# --------------------------------------------------------------------------------------------


def step_text(step: dict[str, Any]) -> str:
    kind, value = next(iter(step.items()))
    if kind == "set_weight":
        return f"set weight {value}%"
    if kind == "pause":
        seconds = (value or {}).get("seconds")
        return f"pause {seconds:g}s" if seconds else "pause until resumed"
    return kind


def weights_text(weights: dict[str, int]) -> str:
    return ", ".join(f"v{version} {weight}%" for version, weight in sorted(
        weights.items(), key=lambda item: int(item[0])))


def summary(row: dict[str, Any]) -> str:
    """One line: state, step and weights, and what it waits for."""
    text = f"rollout {row['id']}: {row['state']}"
    steps = row.get("steps") or []
    current = next((s for s in steps if s.get("current")), None)
    if current is not None:
        text += f", step {current['index'] + 1}/{len(steps)} ({step_text(current['step'])})"
    if row.get("weights"):
        text += f", weights {weights_text(row['weights'])}"
    if row.get("requested_action"):
        text += f", {row['requested_action']} asked for"
    if row.get("waiting_for"):
        text += f"; waiting for {row['waiting_for']}"
    return text


def what_is_rolled_out(row: dict[str, Any]) -> str:
    if row["strategy"] == "canary":
        return f"canary of v{row['candidate']} against v{row['baseline']}"
    return "A/B split " + " / ".join(f"v{v['version']} {v['weight']}%" for v in row["variants"])


def waits_for_a_person(row: dict[str, Any]) -> bool:
    return row["state"] in PEOPLE_STATES and not row.get("requested_action")


def ended(row: dict[str, Any]) -> int:
    """The exit code of a rollout that ended, with its last line printed."""
    code = EXIT_CODES[row["state"]]
    reason = row.get("reason") or ""
    say(f"rollout {row['id']} {row['state'].replace('_', ' ')}" + (f": {reason}" if reason else ""))
    return code


class StatusLine:
    """The line ``follow`` rewrites in place on a terminal; ``say`` and ``warn`` end it first."""

    open = False

    def show(self, text: str) -> None:
        sys.stdout.write("\r\x1b[K" + text)
        sys.stdout.flush()
        self.open = True

    def end(self) -> None:
        if self.open:
            self.open = False
            sys.stdout.write("\n")
            sys.stdout.flush()


STATUS = StatusLine()


def follow(read: Callable[[], dict[str, Any]], line_of: Callable[[dict[str, Any]], str],
           done: Callable[[dict[str, Any]], int | None], what: str, timeout: float,
           sleep: Callable[[float], None] = time.sleep,
           step_of: Callable[[dict[str, Any]], str] | None = None,
           live: bool = False) -> int:
    """Poll ``read()`` every second until ``done`` gives an exit code (or the timeout:
    WAITING); an unreachable API is retried. ``live`` (a terminal): every change of
    ``line_of`` the row rewrites one line in place. Otherwise a line is printed at each change
    of ``step_of`` the row (a line per level, not per percent), or of the line itself."""
    deadline = time.monotonic() + timeout
    latest, step = "", None
    unreachable = False
    try:
        while True:
            try:
                row = read()
            except Refused as exc:
                if not exc.transient:
                    raise
                if not unreachable:
                    warn(f"{exc}; trying again")
                unreachable = True
            else:
                unreachable = False
                line = line_of(row)
                now = line if live or step_of is None else step_of(row)
                if now != step:
                    if live:
                        STATUS.show(line)
                    else:
                        say(line)
                latest, step = line, now
                code = done(row)
                if code is not None:
                    return code
            if time.monotonic() >= deadline:
                say(f"timed out after {timeout:g}s: {latest or f'{what} not read'}")
                return WAITING
            sleep(POLL_S)
    finally:
        STATUS.end()


def wait(client: Client, rollout_id: int, timeout: float, stop_when_waiting: bool = False,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll the rollout every second until it ends (or the timeout); print each change."""

    def done(row: dict[str, Any]) -> int | None:
        if row["state"] in EXIT_CODES:
            return ended(row)
        if stop_when_waiting and waits_for_a_person(row):
            say(f"rollout {rollout_id} waits for a person: {row.get('waiting_for') or row['state']}")
            return WAITING
        return None

    return follow(lambda: client.rollout(rollout_id), summary, done, f"rollout {rollout_id}",
                  timeout, sleep)


# --------------------------------------------------------------------------------------------
# Showing a benchmark
# --------------------------------------------------------------------------------------------


def number_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def benchmark_line(row: dict[str, Any]) -> str:
    """One line: state, progress and what the job is doing."""
    text = f"benchmark {row['id']}: {row['state']}"
    if row["state"] not in BENCHMARK_EXIT_CODES:
        text += f" {round(float(row.get('progress') or 0) * 100)}%"
    if row.get("phase"):
        text += f", {row['phase']}"
    if row.get("cancel_requested_by") and row["state"] not in BENCHMARK_EXIT_CODES:
        text += f"; cancel asked for by {row['cancel_requested_by']}"
    return text


def benchmark_step(row: dict[str, Any]) -> str:
    """What a new line is printed for when the output is not a terminal: the state and the
    phase (the level being measured), not each percent."""
    return f"{row['state']} {row.get('phase') or ''}"


def level_name(mode: str, value: Any) -> str:
    """A level as the job's page and phase name it (rollouts.benchmarks.specs.level_name)."""
    if mode == "concurrency":
        return f"concurrency {number_text(value)}"
    return f"{number_text(value)} req/s offered"


def load_text(mode: str, sweep: dict[str, Any] | None) -> str:
    """The most load carried within the SLO, in words."""
    if not sweep or sweep.get("max_load") is None:
        return "no level within the SLO"
    text = f"{level_name(mode, sweep['max_load'])}: {sweep['max_load_rps']:.1f} req/s"
    if sweep.get("max_load_p99_ms") is not None:
        text += f", p99 {sweep['max_load_p99_ms']:.1f} ms"
    return text


def benchmark_summary(row: dict[str, Any]) -> list[str]:
    """The lines that end a job: how it ended, the max load within the SLO, per config."""
    state = row["state"]
    why = (row.get("error") or row.get("phase") or "").strip().splitlines()
    head = f"benchmark {row['id']} {state}"
    if state != "succeeded":
        return [head + (f": {why[0]}" if why else "")]
    summary = row.get("summary") or {}
    lines = [f"{head}: v{row['version']} on {row['server']}, max load within the SLO "
             f"{load_text(row['mode'], summary.get('best'))}"]
    configs = summary.get("configs") or []
    if len(configs) > 1:
        lines.append(f"best config: {summary.get('best_label')}")
        for config in configs:
            figure = (config["error"] if config.get("error") else
                      "no level within the SLO" if config.get("max_load_rps") is None
                      else f"{config['max_load_rps']:.1f} req/s")
            lines.append(f"  {config['label']}: {figure}")
    return lines


def wait_benchmark(client: Client, job_id: int, timeout: float,
                   sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll the job every second until it ends (or the timeout). On a terminal its progress
    is one line updated in place; otherwise a line per state and level."""

    def done(row: dict[str, Any]) -> int | None:
        if row["state"] not in BENCHMARK_EXIT_CODES:
            return None
        for text in benchmark_summary(row):
            say(text)
        return BENCHMARK_EXIT_CODES[row["state"]]

    return follow(lambda: client.benchmark(job_id), benchmark_line, done, f"benchmark {job_id}",
                  timeout, sleep, step_of=benchmark_step, live=sys.stdout.isatty())


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def json_arg(name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{name} is not valid JSON: {exc}") from None
    return parse


def cmd_start(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"deployment": args.deployment, "strategy": args.strategy}
    for key in ("version", "baseline", "steps", "analysis", "variants", "duration_s",
                "sample_size", "reason"):
        value = getattr(args, key)
        if value is not None:
            body[key] = value
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    status, row = client.call("POST", "rollouts/", body, headers)
    made = "requested" if status == 201 else "already requested with this Idempotency-Key"
    if not args.wait:
        warn(f"rollout {row['id']} {made}: {what_is_rolled_out(row)}, {row['state']}")
        say(str(row["id"]))
        return OK
    say(f"rollout {row['id']} {made}: {what_is_rolled_out(row)}")
    return wait(client, row["id"], args.timeout, args.stop_when_waiting)


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    row = client.rollout(args.id)
    if args.json:
        say(json.dumps(row, indent=2))
        return OK
    say(f"rollout {row['id']} of {row['deployment_name']}: {what_is_rolled_out(row)}, "
        f"requested by {row['requested_by_label']}")
    say(summary(row))
    if row.get("reason"):
        say(f"reason: {row['reason']}")
    return OK


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    return wait(client, args.id, args.timeout, args.stop_when_waiting)


def cmd_action(client: Client, args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else {}
    _status, row = client.call("POST", f"rollouts/{args.id}/{args.action}/", body)
    say(f"{args.action} asked for; {summary(row)}")
    return OK


def levels_arg(text: str) -> list[int | float]:
    """``1,2,4`` or ``10.5,20``: the levels of a sweep."""
    levels: list[int | float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--levels takes numbers separated by commas, got {item.strip()!r}") from None
        levels.append(int(value) if value.is_integer() else value)
    return levels


def cmd_benchmark_start(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"deployment": args.deployment, "version": args.version}
    for key in ("server", "protocol", "mode", "levels", "duration_s", "warmup_s",
                "max_requests", "slo", "configs", "request"):
        value = getattr(args, key)
        if value is not None:
            body[key] = value
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    status, row = client.call("POST", "benchmarks/", body, headers)
    made = "requested" if status == 201 else "already requested with this Idempotency-Key"
    what = (f"v{row['version']} of {row['model']} on {row['server']}, {row['mode']} "
            f"{', '.join(number_text(v) for v in row['levels'])}")
    if not args.wait:
        warn(f"benchmark {row['id']} {made}: {what}, {row['state']}")
        say(str(row["id"]))
        return OK
    say(f"benchmark {row['id']} {made}: {what}")
    return wait_benchmark(client, row["id"], args.timeout)


def cmd_benchmark_status(client: Client, args: argparse.Namespace) -> int:
    row = client.benchmark(args.id)
    if args.json:
        say(json.dumps(row, indent=2))
        return OK
    say(f"benchmark {row['id']} of v{row['version']} of {row['model']} on {row['server']} "
        f"({row['deployment_name']}), requested by {row['requested_by_label']}")
    say(benchmark_line(row))
    if row["state"] in BENCHMARK_EXIT_CODES:
        for text in benchmark_summary(row):
            say(text)
    return OK


def cmd_benchmark_wait(client: Client, args: argparse.Namespace) -> int:
    return wait_benchmark(client, args.id, args.timeout)


def cmd_benchmark_results(client: Client, args: argparse.Namespace) -> int:
    _status, body = client.call("GET", f"benchmarks/{args.id}/results/")
    say(json.dumps(body, indent=2))
    return OK


def cmd_benchmark_cancel(client: Client, args: argparse.Namespace) -> int:
    _status, row = client.call("POST", f"benchmarks/{args.id}/cancel/", {})
    say(f"cancel asked for; {benchmark_line(row)}")
    return OK


def add_benchmark_commands(groups: Any) -> None:
    benchmark = groups.add_parser("benchmark", help="measure a version's capacity")
    commands = benchmark.add_subparsers(dest="command", required=True, parser_class=Parser)

    start = commands.add_parser("start", help="ask for a benchmark (prints its id)")
    start.add_argument("--deployment", required=True, help="deployment id or name")
    start.add_argument("--version", type=int, required=True, help="the version number")
    start.add_argument("--server", help="the deployment's server (needed when it has several)")
    start.add_argument("--protocol", choices=["triton_http", "triton_grpc", "openai_completions",
                                              "openai_chat"])
    start.add_argument("--mode", choices=["concurrency", "rate"])
    start.add_argument("--levels", type=levels_arg,
                       help="concurrencies or request rates, e.g. 1,2,4,8")
    start.add_argument("--duration-s", dest="duration_s", type=float,
                       help="measured seconds per level")
    start.add_argument("--warmup-s", dest="warmup_s", type=float,
                       help="unmeasured seconds before each level")
    start.add_argument("--max-requests", dest="max_requests", type=int,
                       help="end a level after this many requests")
    start.add_argument("--slo", type=json_arg("--slo"),
                       help='JSON object, e.g. \'{"p99_ms": 40, "error_rate": 0.01}\'')
    start.add_argument("--configs", type=json_arg("--configs"),
                       help='Triton config overrides to compare, e.g. '
                            '\'[{"instance_group": 1}, {"instance_group": 2}]\'')
    start.add_argument("--request", type=json_arg("--request"),
                       help="what each request carries (JSON object)")
    start.add_argument("--idempotency-key", help="the same key replays the first request")
    start.add_argument("--wait", action="store_true", help="then wait until it ends")
    start.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help="seconds to wait before exiting 5 (default 3600)")
    start.set_defaults(run=cmd_benchmark_start)

    status = commands.add_parser("status", help="show a benchmark")
    status.add_argument("id", type=int)
    status.add_argument("--json", action="store_true", help="the API's full answer")
    status.set_defaults(run=cmd_benchmark_status)

    wait_cmd = commands.add_parser("wait", help="wait until a benchmark ends; exit by its end")
    wait_cmd.add_argument("id", type=int)
    wait_cmd.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                          help="seconds to wait before exiting 5 (default 3600)")
    wait_cmd.set_defaults(run=cmd_benchmark_wait)

    results = commands.add_parser("results", help="print the figures as JSON")
    results.add_argument("id", type=int)
    results.set_defaults(run=cmd_benchmark_results)

    cancel = commands.add_parser("cancel", help="stop a benchmark")
    cancel.add_argument("id", type=int)
    cancel.set_defaults(run=cmd_benchmark_cancel)


class Parser(argparse.ArgumentParser):
    """Usage errors exit 1: 2 means a rollout rolled back."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        warn(f"{self.prog}: error: {message}")
        raise SystemExit(ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="switchyard", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = parser.add_subparsers(dest="group", required=True, parser_class=Parser)
    rollout = groups.add_parser("rollout", help="start, watch and steer rollouts")
    commands = rollout.add_subparsers(dest="command", required=True, parser_class=Parser)

    def waiting(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                         help="seconds to wait before exiting 5 (default 3600)")
        sub.add_argument("--stop-when-waiting", action="store_true",
                         help="exit 5 as soon as the rollout waits for a person (an approval, "
                              "a pause until resumed, an inconclusive analysis)")

    start = commands.add_parser("start", help="ask for a rollout (prints its id)")
    start.add_argument("--deployment", required=True, help="deployment id or name")
    start.add_argument("--version", type=int, help="canary: the candidate's version number")
    start.add_argument("--baseline", type=int, help="canary: the stable version")
    start.add_argument("--strategy", choices=["canary", "ab"], default="canary")
    start.add_argument("--steps", type=json_arg("--steps"),
                       help='JSON list, e.g. \'[{"set_weight": 10}, {"analysis": {}}]\'')
    start.add_argument("--analysis", type=json_arg("--analysis"),
                       help='JSON object, e.g. \'{"planned_samples": 2000}\'')
    start.add_argument("--variants", type=json_arg("--variants"),
                       help='A/B: JSON list, e.g. \'[{"version": 1, "weight": 50}, ...]\'')
    start.add_argument("--duration-s", dest="duration_s", type=int, help="A/B: seconds")
    start.add_argument("--sample-size", dest="sample_size", type=int,
                       help="A/B: requests per variant")
    start.add_argument("--reason")
    start.add_argument("--idempotency-key", help="the same key replays the first request")
    start.add_argument("--wait", action="store_true", help="then wait until it ends")
    waiting(start)
    start.set_defaults(run=cmd_start)

    status = commands.add_parser("status", help="show a rollout")
    status.add_argument("id", type=int)
    status.add_argument("--json", action="store_true", help="the API's full answer")
    status.set_defaults(run=cmd_status)

    wait_cmd = commands.add_parser("wait", help="wait until a rollout ends; exit by its end")
    wait_cmd.add_argument("id", type=int)
    waiting(wait_cmd)
    wait_cmd.set_defaults(run=cmd_wait)

    for name, text in (("pause", "pause a progressing canary"), ("resume", "resume it"),
                       ("promote", "promote the canary now"),
                       ("abort", "send all traffic back to the baseline")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("id", type=int)
        sub.add_argument("--reason")
        sub.set_defaults(run=cmd_action, action=name)
    add_benchmark_commands(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = os.environ.get("SWITCHYARD_TOKEN", "").strip()
    if not token:
        warn("switchyard: set SWITCHYARD_TOKEN to a tenant API token")
        return ERROR
    client = Client(os.environ.get("SWITCHYARD_URL", "").strip() or DEFAULT_URL, token)
    try:
        return args.run(client, args)
    except Refused as exc:
        warn(f"switchyard: {exc}")
        return ERROR
    except KeyboardInterrupt:
        warn("switchyard: interrupted")
        return ERROR


if __name__ == "__main__":
    sys.exit(main())
