import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engine_imports_without_django():
    """agent_runtime must not import Django (not even django.conf) anywhere."""
    code = (
        "import sys, pkgutil, importlib, agent_runtime\n"
        "for m in pkgutil.walk_packages(agent_runtime.__path__, 'agent_runtime.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n == 'django' or n.startswith('django.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_no_source_file_of_the_engine_mentions_django():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "agent_runtime").rglob("*.py")
        if "import django" in path.read_text() or "from django" in path.read_text()
    ]
    assert offenders == []
