"""A worker's start line names its SQLite store's absolute file, and a store that does
not exist yet under a three-slash URL (``sqlite:///tmp/x.db``: ``./tmp/x.db``) is told
with the four-slash URL of the file the path names read as absolute (review 42,
finding 5: a mistyped URL waited on an empty store in silence)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from test_workers import Worker, project  # noqa: F401 (a fixture)


def test_the_start_line_names_the_file_and_the_absolute_url(project: Path  # noqa: F811
                                                            ) -> None:
    real = project / "real.db"
    sqlite3.connect(real).close()  # a file at the absolute path
    rel = str(real).lstrip("/")
    (project / rel).parent.mkdir(parents=True)  # (the folder: a worker refuses without)
    worker = Worker(project, f"sqlite:///{rel}")
    assert worker.stop() == 0, worker.text
    assert (f"{project / rel} does not exist yet: waiting for the first run recorded "
            f"there (sqlite:///{real} is the absolute path)") in worker.text
    assert f"store sqlite:///{rel} (file {project / rel})," in worker.text
    worker = Worker(project, f"sqlite:///{real}")
    assert worker.stop() == 0, worker.text
    assert f"store sqlite:///{real} (file {real})," in worker.text
    assert "does not exist" not in worker.text
