"""Where a local nginx keeps its files, derived from its prefix directory.

The local cluster's nginx (``local.nginx``) lays its files out under one
prefix; the traffic router that writes its routes (``fleet.inventory.routers``) finds them from the
same prefix without importing the process code. Plain Python: no Django, no settings.
"""

from __future__ import annotations

import shutil
from pathlib import Path

STATUS_PATH = "/nginx_status"


def nginx_binary() -> str:
    """The nginx binary: on ``PATH``, else Debian's ``/usr/sbin/nginx`` (not on a user's PATH)."""
    return shutil.which("nginx") or "/usr/sbin/nginx"


def conf_dir(prefix: Path) -> Path:
    """The directory of the router's files (the main config includes ``<it>/*.conf``)."""
    return Path(prefix).resolve() / "switchyard"


def main_config(prefix: Path) -> Path:
    return Path(prefix).resolve() / "conf" / "nginx.conf"


def error_log(prefix: Path) -> Path:
    return Path(prefix).resolve() / "logs" / "error.log"


def status_url(host: str, port: int) -> str:
    """nginx's ``stub_status`` page on its status server."""
    return f"http://{host}:{port}{STATUS_PATH}"
