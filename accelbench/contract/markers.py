"""pluggy's markers for the ``accelbench`` project and the contract version."""

from __future__ import annotations

import pluggy

PROJECT = "accelbench"

# The plugin contract this accelbench implements. A plugin declares the version it was written for
# (``accelbench_contract = "3.0"``); the same major version and a minor version not newer than this one load.
# 3.0: a backend is a Backend subclass registered through accelbench_register_backends (2.x: per-backend hooks).
# 3.1: Executor.norm_statistics_recomputed (precise batch norm before an evaluation), with a default: 3.0 plugins load.
# 3.2: Backend.device_profiles (measured device profiles shipped as data), with a default: 3.0 and 3.1 plugins load.
# 3.3: Backend.device_kind (the device type made available before it is named), with a default: 3.0-3.2 plugins load.
CONTRACT_VERSION = "3.3"

hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)
