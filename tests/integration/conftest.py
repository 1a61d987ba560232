from ..stubs.sdk_model import sdk_model  # noqa: F401
