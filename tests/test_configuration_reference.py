"""docs/configuration.md lists every setting the product code reads, and only those, with the defaults the
code has; each package reads the environment one way (its configuration module), and no setting has a
default hidden at its reader."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from controlplane.gateway.conf import DEFAULTS as GATEWAY_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"
PACKAGES = ("agents", "contracts", "controlplane", "embedded_broker", "worker_runtime")
# Prefixes, not settings: common/ws_limits.py appends _MAX_MESSAGE_BYTES and _MESSAGES_PER_S to name them.
NOT_SETTINGS = {"MOTLEY_AGENT_WS", "MOTLEY_DASHBOARD_WS"}
# Where a package may read the environment itself, each with the reason.
ENVIRONMENT_READERS = {
    "contracts/env.py": "the typed helpers every configuration module reads through",
    "controlplane/observability/multiproc.py": "PROMETHEUS_MULTIPROC_DIR, prometheus_client's own variable",
    "controlplane/ops/management/commands/run_local.py": "PROMETHEUS_MULTIPROC_DIR, for its processes",
}
# The one configuration module of each package, where its settings are defined (through contracts/env.py).
CONFIGURATION_MODULES = {
    "agents/config.py", "controlplane/settings.py", "worker_runtime/config.py",
    # A secret read when the command runs, never kept among the settings.
    "controlplane/ops/management/commands/ensure_admin.py",
    # The standard OTEL_* variables motley itself reads, shared by every process that traces.
    "contracts/tracing.py",
}

MOTLEY_NAME = re.compile(r"\bMOTLEY_[A-Z0-9_]*[A-Z0-9]\b")
SETTINGS_KEY = re.compile(r"\bsettings\.([A-Z][A-Z0-9_]*)\b")
ENV_HELPER = re.compile(r"\benv_(?:str|int|float|bool|path|list)\(\s*\"([A-Z][A-Z0-9_]*)\"")
ENV_READ = re.compile(r"os\.(?:environ\.get\(|environ\[|getenv\()\s*([\"A-Za-z_][\"A-Za-z0-9_]*)")
GATEWAY_KEY = re.compile(r"\b(?:gateway_setting|limit_setting)\(\s*\"([A-Z][A-Z0-9_]*)\"")


def _sources() -> dict[str, str]:
    files = [path for package in PACKAGES for path in (REPO / package).rglob("*.py")]
    return {str(path.relative_to(REPO)): path.read_text() for path in [*files, REPO / "manage.py"]}


def _listed() -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", PAGE.read_text(), re.MULTILINE))


def _page_defaults() -> dict[str, str]:
    """Each listed name -> its default cell (the first row naming it)."""
    defaults: dict[str, str] = {}
    for line in PAGE.read_text().splitlines():
        if match := re.match(r"^\| `([^`]+)` \|", line):
            defaults.setdefault(match.group(1), line.strip().strip("|").split("|")[2].strip())
    return defaults


def _agrees(value: object, cell: str) -> bool:
    """Whether a default in the code and the page's cell say the same (a literal; other cells are prose)."""
    if value is None or value == "":
        return cell.startswith(("None", "empty", "unset", "none", "generated", "`"))
    if isinstance(value, bool):
        return cell.lower() == str(value).lower()
    if isinstance(value, int | float):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    return cell.strip("`") == value


def _literal_defaults() -> dict[str, object]:
    """Every ``env_*("NAME", literal)`` of the product code -> the literal."""
    found: dict[str, object] = {}
    for text in _sources().values():
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id.startswith("env_") and len(node.args) >= 2 and all(
                    isinstance(arg, ast.Constant) for arg in node.args[:2]):
                found[node.args[0].value] = node.args[1].value
    return found


def _read_by_code() -> dict[str, set[str]]:
    """Every setting name the product code mentions or reads -> the files that do."""
    found: dict[str, set[str]] = defaultdict(set)
    for path, text in _sources().items():
        names = {*MOTLEY_NAME.findall(text), *SETTINGS_KEY.findall(text), *ENV_HELPER.findall(text)}
        names |= {name.strip('"') for name in ENV_READ.findall(text) if name.startswith('"')}
        names |= {f'MOTLEY_GATEWAY["{key}"]' for key in GATEWAY_KEY.findall(text)}
        for name in names - NOT_SETTINGS:
            found[name].add(path)
    return found


def test_every_setting_the_code_reads_is_listed():
    missing = {name: sorted(paths) for name, paths in _read_by_code().items() if name not in _listed()}
    assert not missing, f"settings read by the code but not listed in docs/configuration.md: {missing}"


def test_every_listed_setting_is_read_by_the_code():
    sources = "\n".join(_sources().values())
    gateway = {f'MOTLEY_GATEWAY["{key}"]' for key in GATEWAY_DEFAULTS}
    unread = sorted(name for name in _listed()
                    if name not in gateway and not re.search(rf"\b{re.escape(name)}\b", sources))
    assert not unread, f"docs/configuration.md lists settings no code reads: {unread}"


def test_every_gateway_key_has_its_one_default_and_is_listed():
    read = {name for name in _read_by_code() if name.startswith("MOTLEY_GATEWAY[")}
    known = {f'MOTLEY_GATEWAY["{key}"]' for key in GATEWAY_DEFAULTS}
    assert read <= known, f"gateway keys read without a default in gateway/conf.py: {sorted(read - known)}"
    assert known <= _listed(), f"gateway keys missing from docs/configuration.md: {sorted(known - _listed())}"


def test_the_environment_is_read_only_by_the_configuration_modules():
    readers = {path for path, text in _sources().items() if ENV_READ.search(text)}
    others = sorted(readers - set(ENVIRONMENT_READERS))
    assert not others, f"read the environment through the package's configuration module: {others}"


def test_settings_are_defined_only_in_the_configuration_modules():
    definers = {path for path, text in _sources().items() if ENV_HELPER.search(text)}
    others = sorted(definers - CONFIGURATION_MODULES)
    assert not others, f"define settings in the package's configuration module: {others}"


def test_no_setting_has_a_default_hidden_at_its_reader():
    hidden = sorted(path for path, text in _sources().items() if re.search(r"getattr\(\s*settings\s*,", text))
    assert not hidden, f"getattr(settings, ..., default): define the setting once in settings.py: {hidden}"


def test_the_page_gives_the_defaults_the_code_has():
    page = _page_defaults()
    gateway = {f'MOTLEY_GATEWAY["{key}"]': value for key, value in GATEWAY_DEFAULTS.items()}
    code = {**_literal_defaults(), **gateway}
    wrong = {name: (value, page[name]) for name, value in code.items()
             if name in page and not _agrees(value, page[name])}
    assert not wrong, f"defaults in the code (left) and in docs/configuration.md (right) differ: {wrong}"
