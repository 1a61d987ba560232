"""The model registry: the OpenAI and Anthropic providers by name, their SDKs imported late."""

import subprocess
import sys
from pathlib import Path

import pytest

from agent_runtime.providers import make_provider

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("spec", "options", "provider_class", "model"),
    [
        ("openai:gpt-4o-mini", {"openai_api_key": "k"}, "OpenAIProvider", "gpt-4o-mini"),
        (
            "openai:llama3.1",
            {"openai_base_url": "http://127.0.0.1:11434/v1"},
            "OpenAIProvider",
            "llama3.1",
        ),
        (
            "anthropic:claude-sonnet-4-5",
            {"anthropic_api_key": "k"},
            "AnthropicProvider",
            "claude-sonnet-4-5",
        ),
    ],
)
def test_model_specs_name_the_real_providers(spec, options, provider_class, model):
    provider, model_name = make_provider(spec, options)
    assert type(provider).__name__ == provider_class
    assert model_name == model


def test_sdks_are_imported_only_when_a_provider_is_built():
    code = (
        "import sys\n"
        "import agent_runtime.loop, agent_runtime.providers\n"
        "assert not {'openai', 'anthropic'} & set(sys.modules), 'imported too early'\n"
        "from agent_runtime.providers import make_provider\n"
        "make_provider('anthropic:claude-sonnet-4-5', {'anthropic_api_key': 'k'})\n"
        "assert 'anthropic' in sys.modules and 'openai' not in sys.modules\n"
        "print('ok')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
