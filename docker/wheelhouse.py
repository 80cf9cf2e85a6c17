"""Fill a wheelhouse for the image's Python from this host's pip (docker/build.sh; docs/docker.md).

`pip download` resolves for the Python that runs it, and the base image's Python differs in its
patch release (Debian bookworm's 3.11.2 here, this host's venv 3.11.7): a dependency whose marker
holds only there (redis needs async-timeout below 3.11.3) would be missing, and the image's
offline `pip install --no-index` would fail. So after the plain download, every wheel's
dependencies are evaluated for the target Python, and those that only it needs are downloaded too,
until nothing is missing.

    python docker/wheelhouse.py WHEELHOUSE TARGET_PYTHON_VERSION -r requirements.txt [more pip args]
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename


def download(wheelhouse: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheelhouse), *args], check=True)


def requirements_of(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(archive.read(name).decode())
    return [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]


def missing_for(wheelhouse: Path, target: str) -> set[str]:
    """Requirements the target Python needs (outside any extra) that no wheel in the wheelhouse provides."""
    environment = default_environment() | {
        "python_full_version": target, "python_version": ".".join(target.split(".")[:2]), "extra": "",
    }
    present = {parse_wheel_filename(w.name)[0] for w in wheelhouse.glob("*.whl")}
    needed = set()
    for wheel in wheelhouse.glob("*.whl"):
        for requirement in requirements_of(wheel):
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if canonicalize_name(requirement.name) not in present:
                requirement.marker = None
                needed.add(str(requirement))
    return needed


def main(wheelhouse: Path, target: str, *pip_args: str) -> None:
    wheelhouse.mkdir(parents=True, exist_ok=True)
    download(wheelhouse, *pip_args)
    while needed := missing_for(wheelhouse, target):
        print(f"wheelhouse: for Python {target} also {', '.join(sorted(needed))}")
        download(wheelhouse, *sorted(needed))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2], *sys.argv[3:])
