"""The `docker` marker: tests that build motley's images and run them under dockerd (docs/docker.md)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: builds the images and runs docker/compose.yaml under dockerd")
