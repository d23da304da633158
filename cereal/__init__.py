"""cereal: the message schema (log.capnp), the services table and the messaging API.

`from cereal import log` gives the compiled schema, as in openpilot. See cereal/README.md for the invariants.
"""
import os

import capnp

CEREAL_DIR = os.path.dirname(os.path.abspath(__file__))

# pycapnp reads the .capnp source at import; no generated code is checked in.
capnp.remove_import_hook()
log = capnp.load(os.path.join(CEREAL_DIR, "log.capnp"))
