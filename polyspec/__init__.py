"""polyspec: a multi-language speculator registry and router for vLLM."""

__version__ = "0.1.0"
