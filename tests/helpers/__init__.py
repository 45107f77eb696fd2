"""What the tests share besides their fixtures (tests/conftest.py): running ``cg`` (``cli``), waiting on
conditions and the wire vectors (``support``), groups and publishing (``groups``), the configs a ``cg`` command
line asks for (``vectors``), HTTP probes and scrapes (``http``), the authorizing server of docs/SECURITY.md
(``secured``), the ``nats`` CLI's model of a plugin (``fisk_sim``), network faults (``faultproxy``), leaf nodes
(``leafnodes``), process samples (``sampler``) and Spark's (``spark_support``). No test module is imported by
another."""
