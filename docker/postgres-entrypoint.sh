#!/bin/sh
# Initialise the cluster once (database and role "motley", password from MOTLEY_DB_PASSWORD or
# MOTLEY_DB_PASSWORD_FILE; password authentication over the network), then run the server.
set -eu
if [ -n "${MOTLEY_DB_PASSWORD_FILE:-}" ]; then MOTLEY_DB_PASSWORD="$(cat "$MOTLEY_DB_PASSWORD_FILE")"; fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${MOTLEY_DB_PASSWORD:-}" ]; then
    echo "postgres: MOTLEY_DB_PASSWORD (or MOTLEY_DB_PASSWORD_FILE) is required to initialise the database" >&2
    exit 64
  fi
  initdb -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 >/dev/null
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
  psql -q -U postgres -v ON_ERROR_STOP=1 -v pw="$MOTLEY_DB_PASSWORD" <<'SQL'
CREATE ROLE motley LOGIN PASSWORD :'pw';
CREATE DATABASE motley OWNER motley;
SQL
  pg_ctl -w stop >/dev/null
fi
exec postgres
