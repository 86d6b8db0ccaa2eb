"""Executing a run: the records the engine writes and the fold that derives a run's
state from them (`RunView`), its snapshots, approvals, the journal (the one part
that touches the store), the node call with its context, guards and mapped visits,
where a body runs (a thread, a Ray task, an isolated process: `_isolation/`), and
the scheduler with its edge decisions, and the lease keeper (a thread that renews a
run's claim while its loop may be blocked). Layers 0-7 (tests/test_layers.py).
"""
