"""Rendering of nginx configuration for Switchyard routes (used by ``fleet.adapters.routers.nginx``).

Everything here is a pure function of its arguments: a route spec in, the text of the route's
file out. The file is included at nginx's ``http`` level and holds all the route needs:

* one ``upstream`` per distinct server the variants name, with idle keep-alive connections;
* the variant choice: ``split_clients`` on the request id (``weighted``) or on the sticky
  header's value (``sticky``: a key hashes to the same variant while the weights are
  unchanged; requests without the header are spread at random), or a ``least_conn`` upstream
  whose members are one small internal server per variant (``least-pending``: nginx counts
  the requests in flight to each variant; the internal server rewrites the path for its
  variant, which is why a hop is needed when two variants share a server);
* one ``server`` listening on the route's own port, whose locations rewrite KServe v2 model
  paths to the variant's model and version, pass OpenAI paths through, mirror a share of the
  requests to the candidate (``mirror``; responses discarded), add ``X-Request-Id`` and
  ``X-Switchyard-Variant`` and write one JSON access-log line per request (and one per
  mirrored copy, with ``"mirror":true``); each proxied location waits for a variant's answer
  at most the route's deadline (``timeout_s``, as ``proxy_read_timeout``: per read, so a
  streamed answer may run longer while its chunks keep coming), after which nginx answers 504;
* for a mirror, a relay: an internal server on a unix socket that takes each copy, answers it
  at once and sends it on to the candidate from a mirror of its own. nginx finishes a request
  only once its mirror subrequests are done, and reads the next request of a keep-alive
  connection only then: mirroring straight to a slower candidate would slow the primary's
  clients and stretch the primary's recorded latency to the candidate's. Through the relay
  the primary waits for the relay's immediate answer only;
* on an LLM (OpenAI) route of an nginx with the Lua module (``token_timing``), a body filter
  on the answers streamed to clients (``text/event-stream``) that logs when the first event
  left (``first_token``, seconds from the request's start) and how many tokens the answer
  had (``tokens``: the ``completion_tokens`` of its usage when it carries one, else the
  ``data: {`` events counted, an event split across two chunks counted once): what the time
  per output token is computed from. Answers that are not streamed pass by untouched;
* an identity location, ``/_switchyard/route``, answering the route's name and the hash of
  its file, so the adapter can see which configuration nginx serves.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleet.adapters.routers.base import KSERVE_V2, LEAST_PENDING, STICKY, RouteSpec, Variant
from fleet.adapters.routers.nginx_lua import TOKEN_TIMING_LUA

HEADER_PREFIX = "# switchyard-route: "
IDENTITY_PATH = "/_switchyard/route"
MIRROR_PATH = "/_switchyard/mirror"
MIRROR_SEND_PATH = "/_switchyard/send"  # inside the mirror relay: the copy to the candidate
PATH_HEADER = "X-Switchyard-Path"  # internal: the client's path, to the mirror relay
MIRROR_RELAY = "mirror"  # the relay's socket, beside the least-pending hops' (numbered)
VARIANT_HEADER = "X-Switchyard-Variant"
UPSTREAM_HEADER = "X-Switchyard-Upstream"  # internal: the least-pending hop's real upstream
SHA_PLACEHOLDER = "@@SHA@@"
MAX_KEY = 256  # bytes of a sticky header's value logged (rollouts.traffic.sample_types.MAX_KEY)
# Client paths of a KServe v2 model; the model (and any version) is replaced by the variant's.
KSERVE_MODEL_PATH = r"^/v2/models/[^/]+(?:/versions/[^/]+)?(?<sy_rest>/.*)?$"
KSERVE_SERVER_PATHS = r"^/v2(?:/health/(?:live|ready))?$"
OPENAI_ADMIN_PATHS = r"^/v1/(?:load|unload)_lora_adapter$"
OPENAI_SERVER_PATHS = r"^/(?:health|version|ping)$"
PROXY_READ_TIMEOUT = "300s"  # without a route deadline: long generations stream for minutes
MAX_BODY = "256m"


def base_conf(routes_dir: Path) -> str:
    """The file the nginx ``http`` block includes: shared maps and the route files."""
    return "\n".join(
        [
            "# Written by Switchyard's traffic router; do not edit.",
            "# A client's own X-Request-Id is kept when it is a plain token; otherwise nginx's.",
            "map $http_x_request_id $sy_request_id {",
            '    "~^[A-Za-z0-9._:-]{1,128}$" $http_x_request_id;',
            "    default $request_id;",
            "}",
            "# The path the client asked for, without its query (also inside mirrored copies).",
            "map $request_uri $sy_path {",
            '    "~^(?<sy_path_only>[^?]*)" $sy_path_only;',
            '    default "";',
            "}",
            "# The answer's content type, for the samples (streamed answers: text/event-stream).",
            "map $upstream_http_content_type $sy_content_type {",
            '    "~^(?<sy_content_type_head>.{1,128})" $sy_content_type_head;',
            '    default "";',
            "}",
            f"include {routes_dir}/*.conf;",
            "",
        ]
    )


@dataclass(frozen=True)
class _Server:
    """One upstream server (scheme and address) of a route."""

    upstream: str  # the nginx upstream block's name
    scheme: str
    address: str  # host:port as nginx's ``server`` directive takes it
    host_header: str
    sni: str


@dataclass(frozen=True)
class _Target:
    """Where a variant's requests go."""

    variant: Variant
    server: _Server
    prefix: str  # the upstream URL's path, without a trailing slash

    @property
    def base(self) -> str:
        return f"{self.server.scheme}://{self.server.upstream}{self.prefix}"

    def model_path(self) -> str:
        path = f"/v2/models/{self.variant.model}"
        if self.variant.version is not None:
            path += f"/versions/{self.variant.version}"
        return path


def ident(name: str) -> str:
    """The route name as part of nginx identifiers (slugs hold no "_", so this is 1:1)."""
    return name.replace("-", "_")


def socket_path(socket_dir: Path, route: str, index: int | str) -> Path:
    """The unix socket of the least-pending hop of variant ``index``, or of the mirror relay
    (``MIRROR_RELAY``). Short: socket paths are limited to 107 bytes."""
    digest = hashlib.sha256(route.encode()).hexdigest()[:10]
    return socket_dir / f"{digest}-{index}.sock"


def _servers(route: RouteSpec) -> tuple[list[_Server], list[_Target]]:
    rid = ident(route.name)
    servers: dict[tuple[str, str], _Server] = {}
    targets = []
    for variant in route.variants:
        parts = urlsplit(variant.upstream)
        scheme = parts.scheme
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        shown_host = f"[{host}]" if ":" in host else host
        address = f"{shown_host}:{port}"
        key = (scheme, address)
        if key not in servers:
            servers[key] = _Server(
                upstream=f"sy_{rid}__s{len(servers)}",
                scheme=scheme,
                address=address,
                host_header=address if parts.port else shown_host,
                sni=host,
            )
        targets.append(_Target(variant, servers[key], parts.path.rstrip("/")))
    return list(servers.values()), targets


def _q(value: str) -> str:
    """A double-quoted nginx string (values are validated: no quotes or backslashes)."""
    return f'"{value}"'


def render_route(
    route: RouteSpec,
    *,
    listen: str,
    access_log: Sequence[str],
    socket_dir: Path,
    token_timing: bool = False,
) -> str:
    """The text of the route's file (validated ``route``; ``listen`` as in nginx's ``listen``;
    ``token_timing``: the nginx has the Lua module, and an LLM route times its streamed
    answers' tokens).

    The first line is a JSON header holding the spec, the listen address and the hash of the
    rest of the file; the identity location answers the same hash.
    """
    body = _render_body(route, listen=listen, access_log=access_log, socket_dir=socket_dir,
                        token_timing=token_timing and route.protocol != KSERVE_V2)
    sha = hashlib.sha256(body.encode()).hexdigest()[:16]
    header = {"spec": route.to_json(), "listen": listen, "sha": sha}
    return (
        HEADER_PREFIX
        + json.dumps(header, sort_keys=True)
        + "\n"
        + body.replace(SHA_PLACEHOLDER, sha)
    )


def parse_header(text: str) -> dict[str, object] | None:
    """The JSON header of a route file's text, or None when it has none."""
    first = text.split("\n", 1)[0]
    if not first.startswith(HEADER_PREFIX):
        return None
    try:
        data = json.loads(first[len(HEADER_PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _render_body(
    route: RouteSpec, *, listen: str, access_log: Sequence[str], socket_dir: Path,
    token_timing: bool,
) -> str:
    rid = ident(route.name)
    servers, targets = _servers(route)
    active = [t for t in targets if t.variant.weight > 0]
    lines = [
        "# Generated by Switchyard; do not edit: applying the route again rewrites this file.",
        f"# Route {route.name!r}: {route.protocol}, policy {route.policy}, weights "
        + ", ".join(f"{t.variant.name}={t.variant.weight}" for t in targets),
        "",
    ]
    for server in servers:
        lines += [
            f"upstream {server.upstream} {{",
            f"    server {server.address} max_fails=0;",
            "    keepalive 32;",
            "}",
        ]
    lines += _log_formats(route, token_timing)
    if route.policy == LEAST_PENDING:
        lines += _least_pending_choice(route, active, socket_dir)
    else:
        lines += _split_choice(route, active)
        # Requests the route answers itself (404) were sent to no variant: log none.
        lines += [
            f"map $upstream_addr $sy_{rid}_logged {{",
            '    "" "";',
            f"    default $sy_{rid}_variant;",
            "}",
        ]
        lines += _map(f"$sy_{rid}_variant", f"$sy_{rid}_base", [(t, t.base) for t in active])
        lines += _map(
            f"$sy_{rid}_variant",
            f"$sy_{rid}_host",
            [(t, t.server.host_header) for t in active],
        )
        if _speaks_tls(route):
            sni = [(t, t.server.sni) for t in active]
            lines += _map(f"$sy_{rid}_variant", f"$sy_{rid}_sni", sni)
        if route.protocol == KSERVE_V2:
            lines += _map(
                f"$sy_{rid}_variant", f"$sy_{rid}_model", [(t, t.model_path()) for t in active]
            )
    mirror = _mirror_target(route, targets)
    if mirror is not None and route.mirror is not None and route.mirror.percent < 100:
        lines += [
            f'split_clients "mirror:${{request_id}}" $sy_{rid}_mirror {{',
            f'    {route.mirror.percent}% "1";',
            '    * "";',
            "}",
        ]
    if mirror is not None and route.protocol == KSERVE_V2:
        lines += [
            f"map $request_uri $sy_{rid}_mirror_uri {{",
            f'    "~^/v2/models/[^/?]+(?:/versions/[^/?]+)?(?<sy_{rid}_mtail>/[^?]*)?'
            f'(?<sy_{rid}_margs>\\?.*)?$" "{mirror.prefix}{mirror.model_path()}'
            f'$sy_{rid}_mtail$sy_{rid}_margs";',
            f'    default "{mirror.prefix}{mirror.model_path()}";',
            "}",
        ]
    relay = socket_path(socket_dir, route.name, MIRROR_RELAY)
    if mirror is not None:
        lines += [
            f"upstream sy_{rid}__mirror {{",
            f"    server unix:{relay} max_fails=0;",
            "    keepalive 16;",
            "}",
        ]
    lines += _front_server(route, listen, access_log, mirror, token_timing)
    if mirror is not None:
        lines += _mirror_relay(route, mirror, access_log, relay)
    if route.policy == LEAST_PENDING:
        for index, target in enumerate(targets):
            if target.variant.weight > 0:
                lines += _hop_server(route, target, socket_path(socket_dir, route.name, index))
    return "\n".join(lines) + "\n"


def _log_formats(route: RouteSpec, token_timing: bool = False) -> list[str]:
    rid = ident(route.name)
    upstream_addr = (
        f"$upstream_http_{UPSTREAM_HEADER.lower().replace('-', '_')}"
        if route.policy == LEAST_PENDING
        else "$upstream_addr"
    )

    def fmt(name: str, variant: str, mirror: str, addr: str, path: str = "$sy_path",
            key: str = "", tokens: bool = False) -> str:
        fields = [
            '"time":"$time_iso8601"',
            '"msec":$msec',
            f'"route":"{route.name}"',
            f'"variant":"{variant}"',
            f'"mirror":{mirror}',
            '"method":"$request_method"',
            f'"path":"{path}"',
            '"status":$status',
            f'"upstream_addr":"{addr}"',
            '"upstream_status":"$upstream_status"',
            '"upstream_response_time":"$upstream_response_time"',
            '"upstream_header_time":"$upstream_header_time"',
            '"content_type":"$sy_content_type"',
            f'"key":"{key}"',
            '"request_time":$request_time',
            '"bytes_sent":$bytes_sent',
            '"request_id":"$sy_request_id"',
        ]
        if tokens:
            fields += ['"first_token":"$sy_first_token"', '"tokens":"$sy_tokens"']
        return f"log_format {name} escape=json '{{{','.join(fields)}}}';"

    # least-pending knows the variant from the upstream address: "" when there was none.
    logged = f"$sy_{rid}_variant" if route.policy == LEAST_PENDING else f"$sy_{rid}_logged"
    lines, key = [], ""
    if route.policy == STICKY:
        # The sticky header's value, its first MAX_KEY bytes (whatever they are: escape=json
        # writes control bytes as \u00XX), "" without one: the samples keep a hash of it.
        header = "$http_" + route.sticky_header.lower().replace("-", "_")
        key = f"$sy_{rid}_logkey"
        lines += [
            f"map {header} {key} {{",
            f'    "~(?s)^(?<sy_{rid}_keyhead>.{{1,{MAX_KEY}}})" $sy_{rid}_keyhead;',
            '    default "";',
            "}",
        ]
    lines.append(fmt(f"sy_{rid}", logged, "false", upstream_addr, key=key, tokens=token_timing))
    if route.mirror is not None and route.mirror.percent > 0:
        # Written by the mirror relay, which has the client's path from the front server
        # (and no sticky key: a copy is no user's request).
        path = "$http_" + PATH_HEADER.lower().replace("-", "_")
        lines.append(fmt(f"sy_{rid}_mirror", route.mirror.variant, "true", "$upstream_addr", path))
    return lines


def _split_choice(route: RouteSpec, active: list[_Target]) -> list[str]:
    rid = ident(route.name)
    lines = []
    if route.policy == STICKY:
        header = "$http_" + route.sticky_header.lower().replace("-", "_")
        lines += [
            f"map {header} $sy_{rid}_key {{",
            '    "" $request_id;',
            f"    default {header};",
            "}",
        ]
        key = f"{route.name}:${{sy_{rid}_key}}"
    else:
        key = "${request_id}"
    lines.append(f'split_clients "{key}" $sy_{rid}_variant {{')
    for target in active[:-1]:
        lines.append(f"    {target.variant.weight}% {_q(target.variant.name)};")
    lines.append(f"    * {_q(active[-1].variant.name)};")
    lines.append("}")
    return lines


def _least_pending_choice(route: RouteSpec, active: list[_Target], socket_dir: Path) -> list[str]:
    rid = ident(route.name)
    index_of = {v.name: i for i, v in enumerate(route.variants)}
    members = [
        (t, f"unix:{socket_path(socket_dir, route.name, index_of[t.variant.name])}") for t in active
    ]
    lines = [f"upstream sy_{rid}__lp {{", "    least_conn;"]
    lines += [f"    server {addr} weight={t.variant.weight} max_fails=0;" for t, addr in members]
    lines += ["    keepalive 32;", "}"]
    lines += [f"map $upstream_addr $sy_{rid}_variant {{"]
    # Matched on the socket's file name: whole paths outgrow the map's hash buckets.
    for target, addr in members:
        pattern = "/" + re.escape(Path(addr).name) + "$"
        lines.append(f'    "~{pattern}" {_q(target.variant.name)};')
    lines += ['    default "";', "}"]
    return lines


def _map(source: str, dest: str, pairs: list[tuple[_Target, str]]) -> list[str]:
    lines = [f"map {source} {dest} {{"]
    lines += [f"    {_q(t.variant.name)} {_q(value)};" for t, value in pairs]
    lines += ['    default "";', "}"]
    return lines


def _mirror_target(route: RouteSpec, targets: list[_Target]) -> _Target | None:
    if route.mirror is None or route.mirror.percent == 0:
        return None
    return next(t for t in targets if t.variant.name == route.mirror.variant)


def read_timeout(route: RouteSpec) -> str:
    """How long nginx waits for each read of a variant's answer: the route's deadline, in
    milliseconds (a request unanswered by then ends with 504), else PROXY_READ_TIMEOUT."""
    if route.timeout_s is None:
        return PROXY_READ_TIMEOUT
    return f"{max(round(route.timeout_s * 1000), 1)}ms"


def _proxy_headers(route: RouteSpec, host: str, sni: str | None) -> list[str]:
    """Directives every proxied location repeats (nginx inherits none of them into a location
    that sets one of its own). ``sni``: the TLS server name, when a server speaks https."""
    lines = [
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        f"proxy_set_header Host {host};",
        "proxy_set_header X-Request-Id $sy_request_id;",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        f"proxy_read_timeout {read_timeout(route)};",
        "proxy_next_upstream off;",
    ]
    if sni is not None:
        lines += ["proxy_ssl_server_name on;", f"proxy_ssl_name {sni};"]
    return lines


def _speaks_tls(route: RouteSpec) -> bool:
    return any(server.scheme == "https" for server in _servers(route)[0])


def _tls(server: _Server) -> str | None:
    return server.sni if server.scheme == "https" else None


def _front_server(
    route: RouteSpec, listen: str, access_log: Sequence[str], mirror: _Target | None,
    token_timing: bool = False,
) -> list[str]:
    rid = ident(route.name)
    lp = route.policy == LEAST_PENDING
    if lp:
        headers = [*_proxy_headers(route, "$host", None), f"proxy_hide_header {UPSTREAM_HEADER};"]
    else:
        sni = f"$sy_{rid}_sni" if _speaks_tls(route) else None
        headers = _proxy_headers(route, f"$sy_{rid}_host", sni)
    headers += [
        "add_header X-Request-Id $sy_request_id always;",
        f"add_header {VARIANT_HEADER} $sy_{rid}_variant always;",
    ]
    mirror_line = [f"mirror {MIRROR_PATH};"] if mirror is not None else []
    lines = [
        "server {",
        f"    listen {listen};",
        f"    client_max_body_size {MAX_BODY};",
    ]
    if token_timing:
        # Every location's line logs them: "" unless the body filter saw a streamed event.
        lines += ['    set $sy_first_token "";', '    set $sy_tokens "";']
    lines += [f"    access_log {sink} sy_{rid};" for sink in access_log] or ["    access_log off;"]
    lines += [
        f"    location = {IDENTITY_PATH} {{",
        "        access_log off;",
        "        default_type application/json;",
        f'        return 200 \'{{"route":"{route.name}","sha":"{SHA_PLACEHOLDER}"}}\';',
        "    }",
    ]

    def location(match: str, extra: list[str], target: str) -> list[str]:
        inner = [*extra, *headers, f"proxy_pass {target};"]
        return [f"    location {match} {{", *[f"        {d}" for d in inner], "    }"]

    if route.protocol == KSERVE_V2:
        model_target = (
            f"http://sy_{rid}__lp"
            if lp
            else (f"$sy_{rid}_base$sy_{rid}_model$sy_rest$is_args$args")
        )
        server_target = f"http://sy_{rid}__lp" if lp else f"$sy_{rid}_base$uri$is_args$args"
        lines += location(f"~ {KSERVE_MODEL_PATH}", mirror_line, model_target)
        lines += location(f"~ {KSERVE_SERVER_PATHS}", [], server_target)
    else:
        target = f"http://sy_{rid}__lp" if lp else f"$sy_{rid}_base$request_uri"
        lines += [f"    location ~ {OPENAI_ADMIN_PATHS} {{", "        return 403;", "    }"]
        timing = ["body_filter_by_lua_block {", *[f"    {line}" if line else line for line in
                  TOKEN_TIMING_LUA.strip("\n").split("\n")], "}"] if token_timing else []
        lines += location("/v1/", [*mirror_line, "proxy_buffering off;", *timing], target)
        lines += location(f"~ {OPENAI_SERVER_PATHS}", [], target)
    lines += [
        "    location / {",
        "        default_type application/json;",
        '        return 404 \'{"error":"not a path of this route"}\';',
        "    }",
    ]
    if mirror is not None:
        lines += _mirror_location(route, mirror)
    lines.append("}")
    return lines


def _mirror_location(route: RouteSpec, mirror: _Target) -> list[str]:
    """The front server's mirror location: hands the copy (when this request is one of the
    mirrored share) to the relay, which answers at once. Logs nothing: the relay does."""
    rid = ident(route.name)
    assert route.mirror is not None
    uri = f"$sy_{rid}_mirror_uri" if route.protocol == KSERVE_V2 else f"{mirror.prefix}$request_uri"
    lines = [f"    location = {MIRROR_PATH} {{", "        internal;"]
    if route.mirror.percent < 100:
        lines += [f'        if ($sy_{rid}_mirror = "") {{', "            return 204;", "        }"]
    lines += [
        "        access_log off;",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_set_header X-Request-Id $sy_request_id;",
        f"        proxy_set_header {PATH_HEADER} $sy_path;",
        "        proxy_read_timeout 10s;",
        f"        proxy_pass http://sy_{rid}__mirror{uri};",
        "    }",
    ]
    return lines


def _mirror_relay(route: RouteSpec, mirror: _Target, access_log: Sequence[str],
                  sock: Path) -> list[str]:
    """The mirror relay: takes each copy on a unix socket, answers it at once (``empty_gif``
    answers before the copy reaches the candidate: the relay's own mirror runs beside it) and
    sends it to the candidate, logging the candidate's answer as the mirrored sample."""
    rid = ident(route.name)
    directives = [
        *_proxy_headers(route, mirror.server.host_header, _tls(mirror.server)),
        f'proxy_set_header {PATH_HEADER} "";',
    ]
    if route.protocol != KSERVE_V2:
        directives.append("proxy_buffering off;")
    lines = [
        "server {",
        f"    listen unix:{sock};",
        "    access_log off;",
        f"    client_max_body_size {MAX_BODY};",
        "    location / {",
        f"        mirror {MIRROR_SEND_PATH};",
        "        empty_gif;",
        "    }",
        f"    location = {MIRROR_SEND_PATH} {{",
        "        internal;",
        "        log_subrequest on;",
    ]
    lines += [f"        access_log {sink} sy_{rid}_mirror;" for sink in access_log] or [
        "        access_log off;"
    ]
    lines += [f"        {d}" for d in directives]
    lines += [
        f"        proxy_pass {mirror.server.scheme}://{mirror.server.upstream}$request_uri;",
        "    }",
        "}",
    ]
    return lines


def _hop_server(route: RouteSpec, target: _Target, sock: Path) -> list[str]:
    """The internal server of one least-pending variant: rewrites and proxies to it."""
    headers = [
        *_proxy_headers(route, target.server.host_header, _tls(target.server)),
        f"add_header {UPSTREAM_HEADER} $upstream_addr always;",
    ]
    lines = [
        "server {",
        f"    listen unix:{sock};",
        "    access_log off;",
        f"    client_max_body_size {MAX_BODY};",
    ]

    def location(match: str, extra: list[str], dest: str) -> list[str]:
        inner = [*extra, *headers, f"proxy_pass {dest};"]
        return [f"    location {match} {{", *[f"        {d}" for d in inner], "    }"]

    if route.protocol == KSERVE_V2:
        lines += location(
            f"~ {KSERVE_MODEL_PATH}", [], f"{target.base}{target.model_path()}$sy_rest$is_args$args"
        )
        lines += location("/", [], f"{target.base}$uri$is_args$args")
    else:
        lines += location("/", ["proxy_buffering off;"], f"{target.base}$request_uri")
    lines.append("}")
    return lines
