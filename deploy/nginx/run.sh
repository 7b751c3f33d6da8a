#!/bin/sh
# The compose cluster's nginx: runs nginx in the foreground and reloads it whenever Switchyard
# touches $ROUTER_DIR/.reload (the reload command of cluster "compose"). nginx keeps its
# previous configuration when a reload fails. When nginx exits, so does this script, and
# docker restarts the container: nginx starts again on the route files last put in force.
set -eu
CONF=${NGINX_CONF:-/etc/switchyard-nginx/nginx.conf}
ROUTER_DIR=${ROUTER_DIR:-/srv/switchyard/router}
TRIGGER="$ROUTER_DIR/.reload"

mkdir -p /tmp/nginx
nginx -c "$CONF" -e stderr &
pid=$!
trap 'kill -QUIT "$pid" 2>/dev/null; wait "$pid"; exit 0' TERM INT

stamp() { stat -c %y "$TRIGGER" 2>/dev/null || echo none; }
seen=$(stamp)
while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    now=$(stamp)
    if [ "$now" != "$seen" ]; then
        seen=$now
        nginx -c "$CONF" -e stderr -s reload || echo "nginx reload failed" >&2
    fi
done
wait "$pid"
