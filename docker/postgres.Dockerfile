# PostgreSQL for docker/compose.yaml: Debian's package in an image of ours (no image registry).
ARG BASE_IMAGE=motley-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /run/postgresql
COPY docker/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
HEALTHCHECK --interval=5s --timeout=5s --retries=10 CMD ["pg_isready", "-q", "-h", "127.0.0.1"]
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
