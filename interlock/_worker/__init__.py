"""Executing stored runs in a process: a bounded pool with takeover and drain (the
server's and a worker's), a worker's loop of claiming runnable runs, and triggers
(schedule, every, poll: slots and the run ids derived from them). Layers 2 and 8
(tests/test_layers.py).
"""
