"""The example agent package (examples/support_agent) is imported as a deployment would
import it: from its own directory, not from Respawn's."""

import sys

from ..conftest import ROOT
from ..stubs.llm_servers import openai_server
from ..stubs.sdk_model import sdk_model  # noqa: F401

SUPPORT_AGENT = ROOT / "examples" / "support_agent"
sys.path.insert(0, str(SUPPORT_AGENT))

__all__ = ["openai_server"]
