"""WSGI entry point (gunicorn console.wsgi)."""

import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()

# Import every view, serializer and URL pattern now rather than in a worker's first request
# (over a second on a small machine, while clients wait). Then set everything loaded so far
# aside from the garbage collector: it lives as long as the process, and a full collection
# that walks it again stalled requests by 100-250 ms on a 2-core machine (bench/api.py).
get_resolver().url_patterns  # evaluated for its imports
gc.collect()
gc.freeze()
