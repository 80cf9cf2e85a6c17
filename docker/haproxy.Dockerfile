# The load balancer for docker/compose.yaml's web processes: Debian's HAProxy in an image of ours,
# configured by docker/haproxy.cfg (servers and port from the environment).
ARG BASE_IMAGE=motley-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY docker/haproxy.cfg /etc/haproxy/motley.cfg
USER haproxy
ENV MOTLEY_BALANCER_BIND=:8000
EXPOSE 8000
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/motley.cfg"]
