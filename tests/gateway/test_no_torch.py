"""The gateway imports no torch and no worker_runtime, also through what it loads by name at run time
(the pipeline client of ``MOTLEY_GATEWAY["CLIENT"]``, the served models' source): import-linter's
contract in pyproject.toml sees only the imports written in the code."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import REPO_ROOT


def test_the_asgi_process_serving_the_gateway_loads_no_torch():
    probe = (
        "import sys; import controlplane.asgi, controlplane.urls; "
        "from django.utils.module_loading import import_string; "
        "from controlplane.gateway.conf import gateway_setting; "
        "import_string(gateway_setting('CLIENT')); import_string(gateway_setting('SERVED_MODELS')); "
        "import controlplane.gateway.openai.views, controlplane.gateway.accounts.accounting; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'worker_runtime')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"
