# Switchyard: one image for the web server, the Celery worker and Celery beat.
#
#   docker build -t switchyard .
#   web (default command): gunicorn console.wsgi on 0.0.0.0:8000
#   worker:                celery -A console worker -l info
#   beat:                  celery -A console beat -l info --schedule /srv/switchyard/data/celerybeat-schedule
#   migrations:            python manage.py migrate --noinput
#   sample collector:      python manage.py collect_samples --host 0.0.0.0
#   traffic router:        sh /etc/switchyard-nginx/run.sh, deploy/nginx mounted there (nginx)
#
# At run time the image needs SWITCHYARD_PRODUCTION=true, SECRET_KEY (or SECRET_KEY_FILE),
# SWITCHYARD_ALLOWED_HOSTS, DATABASE_URL and REDIS_URL; docker-compose.yml sets them all.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SWITCHYARD_DATA_DIR=/srv/switchyard/data \
    SWITCHYARD_STATIC_ROOT=/srv/switchyard/static \
    WEB_CONCURRENCY=3

WORKDIR /app

# Debian's nginx: the compose cluster's traffic router runs it from this image, and the web
# server and worker test every route change with `nginx -t` before it is put in force.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx \
 && rm -rf /var/lib/apt/lists/*

# Dependencies first, read from pyproject.toml, so this layer is rebuilt only when they change.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the project. It is installed in editable mode so the code stays in /app next to
# templates/ and static/, which the settings find relative to the console package.
COPY README.md manage.py ./
COPY console ./console
COPY fleet ./fleet
COPY rollouts ./rollouts
COPY local ./local
COPY templates ./templates
COPY static ./static
RUN pip install --no-deps -e .

# Static files are collected at build time into SWITCHYARD_STATIC_ROOT (served by WhiteNoise).
# Production settings refuse to load without a secret and allowed hosts, so both are stubbed
# for this one command only; nothing here is kept in the image's environment.
RUN SWITCHYARD_PRODUCTION=true \
    SECRET_KEY=build-time-placeholder-for-collectstatic-only-never-used-at-run-time \
    SWITCHYARD_ALLOWED_HOSTS=localhost \
    python manage.py collectstatic --noinput

# Run as an unprivileged user; it owns only the data folder (Celery beat's schedule file) and
# the router folder (route files shared with the nginx service through a volume).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/switchyard switchyard \
 && mkdir -p /srv/switchyard/data /srv/switchyard/router \
 && chown -R switchyard:switchyard /srv/switchyard/data /srv/switchyard/router
USER switchyard

EXPOSE 8000
# Worker processes: WEB_CONCURRENCY (3 by default: the cores given to the container plus one;
# the API's requests are CPU-bound, and threads or more processes only share the same cores,
# bench/api.py); more gunicorn flags via GUNICORN_CMD_ARGS.
# No control socket: gunicorn's default one is shared by every server of the same home directory.
CMD ["gunicorn", "console.wsgi", "--bind", "0.0.0.0:8000", "--access-logfile", "-", "--no-control-socket"]
