"""The engine tests' fixtures (``env``, ``storage``) come from ``tests.support.engine``."""

from tests.support.engine import env, storage  # noqa: F401 - fixtures, shared with other folders
