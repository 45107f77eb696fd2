"""``cg demo``: partitioned consumer groups at work on an embedded nats-server, checked as they run.

What it does, all on a throwaway nats-server (free loopback port, temporary store):

1. streams ``orders`` (a partition transform puts ``{{partition(4,1)}}`` first) and ``events``;
   a static group ``sg`` on ``orders`` (members m1, m2; m1 runs two instances) and an elastic group
   ``eg`` on ``events`` (6 partitions; members e1, e2; e2 runs two instances, e3 waits to be added);
   every instance is its own process (``python -m cg.demo.worker``);
2. publishes to both streams at a bounded rate, and shows a live view: partitions, their owner
   member and its pinned instance, processing rates and pending messages;
3. SIGKILLs the pinned instance of m1, then the pinned one of e2, and times the standby's takeover;
4. adds e3 to the elastic group, then drops e1, and times the hand-over of their partitions;
5. stops publishing, lets the groups catch up, stops every instance and checks the record of every
   handler call with :mod:`pcgroups.testing._checker`: no loss, order of success per partition, no two
   instances on one partition at once, redeliveries within a bound. Any failure: exit status 1.

With ``--cluster`` the server is a 3-node JetStream cluster (:class:`pcgroups.testing._cluster.EmbeddedCluster`), the
streams have three replicas, every instance connects with the three URLs, and one more phase SIGKILLs the
node leading the ``orders`` stream, times how long until every partition of both groups is handled again
(a JetStream leader election: 4-9 s), and restarts the node.

Every phase scales with ``--duration`` (default 36 s, 60 s with ``--cluster``; 12 s still runs every phase). Into a pipe it
prints progress lines instead of the live view. Every process it started, and the server, are
stopped on the way out, Ctrl-C included.

The package, one concept a module (nothing is imported here: each of the seven instance processes a run
starts, ``python -m cg.demo.worker``, pays only for what it uses):

- :mod:`cg.demo.script`: the scenario: streams, groups, instances, phases and when each step happens
  (``Plan``), and what a run found (``DemoResult``, ``Takeover``, ``Move``);
- :mod:`cg.demo.instances`: the instance processes as the demo sees them (``Worker``);
- :mod:`cg.demo.worker`: an instance process itself;
- :mod:`cg.demo.run`: the run (``Demo``): setup, traffic, kills and membership changes, catching up, checks;
- :mod:`cg.demo.view`: the live view on a terminal, progress lines elsewhere (``View``);
- :mod:`cg.demo.summary`: the last screen, the verdict and its figures at the bottom;
- :mod:`cg.demo.command`: ``cg demo`` itself and :func:`cg.demo.command.demo`.
"""
