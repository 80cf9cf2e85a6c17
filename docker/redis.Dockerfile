# Redis for docker/compose.yaml (Celery broker, channel layer, telemetry cache): Debian's package in
# an image of ours. Nothing is persisted: the database is motley's source of truth.
ARG BASE_IMAGE=motley-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
 && rm -rf /var/lib/apt/lists/*
USER redis
EXPOSE 6379
HEALTHCHECK --interval=5s --timeout=5s --retries=10 CMD ["redis-cli", "ping"]
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
