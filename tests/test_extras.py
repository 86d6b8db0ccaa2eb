"""The command an error gives to install an optional extra: from a checkout (README's
``pip install -e``) the checkout's own extra -- ``interlock[...]`` would fetch whatever
package of that name the index has -- and from a package install the package's."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import interlock
from interlock.support import install_hint

CHECKOUT = Path(interlock.__file__).resolve().parents[1]


def test_from_a_checkout_the_hint_installs_the_checkouts_extra() -> None:
    assert install_hint("postgres") == f"pip install -e '{CHECKOUT}[postgres]'"


def test_from_a_package_install_the_hint_installs_the_package(tmp_path: Path) -> None:
    site = tmp_path / "site-packages" / "interlock"  # an installed copy: no pyproject.toml
    site.mkdir(parents=True)
    shutil.copy(CHECKOUT / "interlock" / "_extras.py", site / "_extras.py")
    (site / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location("installed_extras", site / "_extras.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.install_hint("postgres") == "pip install 'interlock[postgres]'"


def test_a_postgresql_store_without_psycopg_says_how_to_install_it() -> None:
    """In a process of its own, where ``import psycopg`` fails."""
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "import interlock\n"
            "try:\n"
            "    interlock.open_store('postgresql://u@127.0.0.1:1/x')\n"
            "except interlock.StoreError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=CHECKOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"the PostgreSQL store needs psycopg: pip install -e '{CHECKOUT}[postgres]' ("), \
        done.stdout
