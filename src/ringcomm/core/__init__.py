"""The library itself: the communicator front, the plain API, arrays, errors, knobs, tables,
rendezvous, launch, work, the host back end and CPU placement.

Its modules import each other and the compiled core (``ringcomm._C``); the back ends
(``ringcomm.cuda``, ``ringcomm.hier``) only where choosing one is the core's job, as the
import-linter contracts in pyproject.toml state. Nothing here imports torch's backend.
"""
