"""Where a local nginx keeps its files, derived from its prefix directory.

The local cluster's nginx (``local.nginx``) lays its files out under one
prefix; the traffic router that writes its routes (``fleet.inventory.routers``) finds them from the
same prefix without importing the process code. Plain Python: no Django, no settings.
"""

from __future__ import annotations

import shutil
from pathlib import Path

STATUS_PATH = "/nginx_status"
# Debian's libnginx-mod-http-lua and the development kit it needs, in load order: with them
# loaded, an LLM route's streamed answers are timed token by token (the first token's time and
# the number of tokens, ``fleet.adapters.routers.nginx_conf``).
LUA_MODULES = (
    Path("/usr/lib/nginx/modules/ndk_http_module.so"),
    Path("/usr/lib/nginx/modules/ngx_http_lua_module.so"),
)


def nginx_binary() -> str:
    """The nginx binary: on ``PATH``, else Debian's ``/usr/sbin/nginx`` (not on a user's PATH)."""
    return shutil.which("nginx") or "/usr/sbin/nginx"


def token_timing_modules() -> list[Path]:
    """The modules a local nginx loads to time streamed answers' tokens: :data:`LUA_MODULES`
    when all are installed, else none."""
    return list(LUA_MODULES) if all(path.is_file() for path in LUA_MODULES) else []


def conf_dir(prefix: Path) -> Path:
    """The directory of the router's files (the main config includes ``<it>/*.conf``)."""
    return Path(prefix).resolve() / "switchyard"


def main_config(prefix: Path) -> Path:
    return Path(prefix).resolve() / "conf" / "nginx.conf"


def pid_file(prefix: Path) -> Path:
    """The master process's pid file."""
    return Path(prefix).resolve() / "nginx.pid"


def error_log(prefix: Path) -> Path:
    return Path(prefix).resolve() / "logs" / "error.log"


def status_url(host: str, port: int) -> str:
    """nginx's ``stub_status`` page on its status server."""
    return f"http://{host}:{port}{STATUS_PATH}"
