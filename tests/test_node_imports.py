"""The node runs without the ``sim`` extra: none of its role modules imports trio or matplotlib.

Each check runs in a fresh interpreter where both packages are hidden (an import of them fails as if
they were not installed), so a module that needs them at import time fails here even on a machine
that has them. Third-party libraries may still try them (httpcore tries trio and carries on without);
only an attempt from swarmnode's own code counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

ROLE_MODULES = [
    "swarmnode.cli",  # `swarmnode run|train|swarm|...`, every role's entry point
    "swarmnode.roles.trainer",  # role trainer
    "swarmnode.roles.solo",  # `swarmnode train`
    "swarmnode.roles.learner",
    "swarmnode.roles.worker",
    "swarmnode.roles.run",
    "swarmnode.tools.launch",  # `swarmnode swarm` (the demo)
    "swarmnode.verify.worker",  # the verification boundary's process
    "swarmnode.roles.bootstrap",
]

PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, json, os, sys, traceback

    HIDDEN = ("trio", "matplotlib")
    PACKAGE = os.path.dirname(importlib.util.find_spec("swarmnode").origin)
    attempts = []

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] not in HIDDEN:
                return None
            # The frame that ran the import statement: the innermost one outside importlib and this probe.
            frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<")]
            if frames and frames[-1].filename.startswith(PACKAGE):
                attempts.append(f"{name} from {frames[-1].filename}:{frames[-1].lineno}")
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)

    sys.meta_path.insert(0, Hide())
    for module in sys.argv[1:]:
        importlib.import_module(module)
    importlib.import_module("swarmnode.cli").build_parser()  # the CLI also wires `simulate`
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
    print(json.dumps({"attempts": attempts, "loaded": loaded}))
    """
)


@pytest.mark.parametrize("module", ROLE_MODULES)
def test_a_role_module_imports_without_trio_or_matplotlib(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"attempts": [], "loaded": []}


def test_the_simulator_says_which_extra_to_install_when_trio_is_missing() -> None:
    probe = PROBE.replace('importlib.import_module("swarmnode.cli").build_parser()', "")
    done = subprocess.run(
        [sys.executable, "-c", probe, "swarmnode.sim.engine"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode != 0
    assert "pip install 'swarmnode[sim]'" in done.stderr
