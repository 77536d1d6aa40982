"""File formats a user can open and a later step reads: the suite (``suite.yaml``), the run
folder's manifest (``manifest.json``) and the gate (``gate.yaml``). Their fields are typed
pydantic models (:mod:`.models`, the source of docs/formats.md's tables); each carries a schema
version, and a reader meets an unknown one, or a bad field, with a one-line error naming the file
and the field (``clips[2].path: expected ..., found ...``)."""
