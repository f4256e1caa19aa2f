"""``slts simulate``: seeded, deterministic simulation of a container under faults.

Modules, one responsibility each:

* ``seam``: the one source of randomness and time (``random.Random(seed)``, a fake
  clock, the random part of chunk names);
* ``program``: a program is a list of ``Step`` (a kind and a salt), generated from the
  seed; a step resolves its choices against the state it meets, so any subsequence of a
  program is a program too (that is what shrinking relies on);
* ``model``: the plain reference model of every segment's bytes;
* ``checks``: the invariants checked after every step, and the leak check;
* ``world``: the container under test (faulty binding, faulty metadata store, the
  engine instance, zombies, restores) and how each step kind runs on it;
* ``runner``: one seed, many seeds (the soak), replay with shrinking, the summary.

See docs/reliability.md.
"""
