"""The conformance suite of hal.testing over every backend installed here (tox -e cpu runs it)."""

from hal.testing.conformance import *  # noqa: F403
