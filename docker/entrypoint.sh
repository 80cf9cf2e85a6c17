#!/bin/sh
# The image's commands (docs/docker.md):
#   web                  migrate, create the first admin once, serve HTTP and websockets (daphne)
#   worker | beat        the Celery worker (queue "control") | the periodic control tasks
#   agent ARGS...        the node agent: python -m agents run ARGS (--server URL ...)
#   manage ARGS...       any manage.py command (demo_setup, create_join_token, ...)
# Secrets come from the environment or, for NAME_FILE, from the file it names (Docker/compose
# secrets): MOTLEY_SECRET_KEY, MOTLEY_ADMIN_PASSWORD, MOTLEY_JOIN_TOKEN. None is baked in.
set -eu

for name in MOTLEY_SECRET_KEY MOTLEY_ADMIN_PASSWORD MOTLEY_JOIN_TOKEN; do
  eval "file=\${${name}_FILE:-}"
  [ -n "$file" ] || continue
  if [ "$name" = MOTLEY_JOIN_TOKEN ] && [ "${1:-}" = agent ]; then
    # compose's demo service issues the token after the control plane is up: wait for its file.
    waited=0
    while [ ! -s "$file" ] && [ "$waited" -lt "${MOTLEY_JOIN_TOKEN_WAIT_S:-600}" ]; do sleep 1; waited=$((waited + 1)); done
  fi
  if [ ! -r "$file" ] || [ ! -s "$file" ]; then
    echo "entrypoint: ${name}_FILE names $file, which is missing, unreadable or empty" >&2
    exit 64
  fi
  export "$name=$(cat "$file")"
done

role="${1:-web}"
[ $# -gt 0 ] && shift
echo "$role" >/tmp/motley-role
case "$role" in
  web)
    python manage.py migrate --noinput
    python manage.py ensure_admin
    exec python -m daphne -b 0.0.0.0 -p "$MOTLEY_HTTP_PORT" controlplane.asgi:application ;;
  worker)
    exec celery -A controlplane.celery worker --loglevel "${MOTLEY_LOG_LEVEL:-WARNING}" \
      --concurrency "${MOTLEY_WORKER_CONCURRENCY:-2}" --queues control ;;
  beat)
    exec celery -A controlplane.celery beat --loglevel "${MOTLEY_LOG_LEVEL:-WARNING}" \
      --schedule /var/lib/motley/celerybeat-schedule ;;
  agent)
    exec python -m agents run "$@" ;;
  manage)
    exec python manage.py "$@" ;;
  *)
    echo "entrypoint: unknown command '$role'; expected web, worker, beat, agent or manage" >&2
    exit 64 ;;
esac
