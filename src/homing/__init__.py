"""homing: control plane of an LLM inference platform (gateway, router, autoscaler)."""

__version__ = "0.1.0"
