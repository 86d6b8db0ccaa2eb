"""validate's check of the fields a map, a condition or an approval's ``show:`` reads
(review 40, finding 4): a mapped approval showing the map's ``as:`` item was warned
about as a field "no node declares"; and a workflow declaring no ``writes:`` at all got
a warning for every field it read, which no name could have avoided."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import interlock

NODES = "def plan(state):\n    return {'xs': [1, 2]}\n\ndef done(state):\n    return {}\n"


def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, show: str,
         plan: str = "mi_nodes:plan") -> list[str]:
    (tmp_path / "mi_nodes.py").write_text(NODES)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "mgate.yaml"
    path.write_text(textwrap.dedent(f"""\
        workflow: mgate
        state: {{results: {{reducer: replace}}}}
        nodes:
          plan: {plan}
          deploy: {{approval: {{show: [{show}]}}}}
          done: mi_nodes:done
        edges:
          - {{from: START, to: plan}}
          - {{from: plan, map: xs, to: deploy, as: i, collect: results}}
          - {{from: deploy, to: done}}
          - {{from: done, to: END}}
    """))
    return [str(w) for w in interlock.load(str(path)).warnings]


def test_a_mapped_approval_may_show_the_maps_item(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the reviewer's file: no warning at all (both were false)
    assert flow(tmp_path, monkeypatch, "i") == []
    # with writes declared, the item is still declared for its target -- and a name
    # that nothing declares is still warned about, at the show: entry
    declared = "{call: mi_nodes:plan, writes: [xs]}"
    assert flow(tmp_path, monkeypatch, "i", declared) == []
    [warning] = flow(tmp_path, monkeypatch, "j", declared)
    assert ":5:30: warning: node 'deploy': approval shows 'j'" in warning


def test_reads_are_checked_where_the_workflow_declares_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # plan declares writes without xs: the map's read is a misspelling or a field of a
    # node without writes (done has none) -- a warning that says so, not a contradiction
    [warning] = flow(tmp_path, monkeypatch, "i", "{call: mi_nodes:plan, writes: [ys]}")
    assert "map reads 'xs', which no node declares in 'writes'" in warning
    assert "list it in that node's 'writes'" in warning
    assert "may write it" not in warning
    # no node declares writes: no read can be checked, none is warned about
    assert flow(tmp_path, monkeypatch, "j") == []
