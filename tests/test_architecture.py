"""The "only the store writes" contract (tests/architecture.py) catches each way a module
could write the trace behind the store's back, and lets reads and the store's API through.
`lint-imports` in make test runs it over the tree."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.architecture import write_sites

ROOT = Path(__file__).resolve().parent.parent
MODELS = frozenset({"Step", "Checkpoint", "GraphWrite", "GraphBlob", "GraphCheckpoint"})
COLUMNS = frozenset({"fencing_token", "lease_owner", "lease_expires_at", "superseded_at"})


def sites(source: str) -> list[str]:
    found = write_sites(textwrap.dedent(source), "m", MODELS, COLUMNS)
    return [s.what for s in found]


@pytest.mark.parametrize(
    "source, what",
    [
        ("from ..models import Step\nStep.objects.create(seq=1)", "create() on Step"),
        (
            "from ..models import Checkpoint as C\nC.objects.using(db).bulk_create([])",
            "bulk_create() on C",
        ),
        ("from ..models import Step\nrows = [Step(seq=1)]", "builds a Step row"),
        (
            "from ..models import Step\nstep = Step.objects.get(pk=1)\nstep.save()",
            "save() on step",
        ),
        (
            "from ..models import GraphWrite, GraphBlob\n"
            "for model in (GraphWrite, GraphBlob):\n    model.objects.filter().delete()",
            "delete() on model",
        ),
        ("session.fencing_token += 1", "sets .fencing_token"),
        ("session.lease_owner = None", "sets .lease_owner"),
        ("qs.update(superseded_at=now)", "update() sets superseded_at"),
        ("step.save(update_fields=['payload'])", "save() writes payload"),
        (
            "cursor.execute(f'UPDATE {t} SET last_seq = 1 WHERE fencing_token = %s')",
            "SQL that writes a fenced column",
        ),
        (
            "from ..models import Step\nStep.objects.filter(x=1)._raw_delete(db)",
            "_raw_delete() on Step",
        ),
    ],
)
def test_each_way_to_write_the_trace_is_caught(source, what):
    assert what in sites(source)


def test_reads_and_the_stores_api_pass():
    assert (
        sites(
            """
            from ..models import AgentSession, Step
            from ..store import writes
            rows = list(Step.objects.filter(session=s).values_list("seq", flat=True))
            count = Step.objects.filter(superseded_at__isnull=True).count()
            preview.superseded = rows  # a dataclass, not the column
            writes.add_step(session, "user", {"text": "hi"})
            AgentSession.objects.filter(id=1).update(title="x")
            cursor.execute("SELECT fencing_token FROM sessions_app_agentsession")
            shown = Step(seq=1, kind="user")  # not stored
            """
        )
        == []
    )


def test_the_tree_keeps_the_contract_and_a_write_outside_the_store_breaks_it(tmp_path):
    """The real contract over the real tree is kept; the same tree with one module that
    writes a step is broken, and the report names the line."""
    lint = Path(sys.executable).with_name("lint-imports")
    kept = subprocess.run(
        [str(lint), "--contract", "only-the-store-writes"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    rogue = ROOT / "sessions_app" / "selectors" / "zz_rogue_writer.py"
    rogue.write_text("from ..models import Step\n\n\ndef f():\n    Step.objects.create(seq=1)\n")
    try:
        broken = subprocess.run(
            [str(lint), "--contract", "only-the-store-writes", "--no-cache"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        rogue.unlink()
    assert broken.returncode == 1
    assert "sessions_app.selectors.zz_rogue_writer:5 create() on Step" in broken.stdout
