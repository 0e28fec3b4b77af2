"""Running grids: a grid file expands into run specs (:mod:`~fwbench.run.grid`), the runner skips what
the results store holds (:mod:`~fwbench.run.runner`, :mod:`~fwbench.run.store`), a launcher places each
run (:mod:`~fwbench.run.launchers`: this process, Ray, torchrun via :mod:`~fwbench.run.distributed`),
and :mod:`~fwbench.run.execute` trains it with the seeded loop of :mod:`~fwbench.run.training`
(optimiser in :mod:`~fwbench.run.optimization`, checkpoints in :mod:`~fwbench.run.checkpoint`) into
one JSON record. Also here: the environment a record carries, the allocator tuning at start-up, and
sampling text from a language-model checkpoint.

Lowest room of the harness: imports only :mod:`fwbench.errors`, :mod:`fwbench.tasks` and
:mod:`fwbench.variants`.
"""
