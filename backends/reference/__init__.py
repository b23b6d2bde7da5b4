"""hal.backends.reference: every op in plain torch. The oracle of every test, and the fallback that
accepts any spec on any device, ranked last."""

from hal.backends.reference.backend import backend

__all__ = ["backend"]
