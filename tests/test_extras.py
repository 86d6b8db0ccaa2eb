"""The command an error gives to install an optional extra: from a checkout (README's
``pip install -e``) the checkout's own extra -- ``interlock[...]`` would fetch whatever
package of that name the index has -- and from a package install the package's."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

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


def test_a_postgresql_store_without_psycopg_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")
                 or m == "interlock._store._postgres"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # (import psycopg: ImportError)
    with pytest.raises(interlock.StoreError) as caught:
        interlock.open_store("postgresql://u@127.0.0.1:1/x")
    assert str(caught.value).startswith(
        f"the PostgreSQL store needs psycopg: pip install -e '{CHECKOUT}[postgres]' (")
