"""File formats a user can open and a later step reads: the suite (``suite.yaml``), the run
folder's manifest (``manifest.json``) and the gate (``gate.yaml``). Each carries a schema version;
a reader meets an unknown one with a clear error naming the file and field."""
