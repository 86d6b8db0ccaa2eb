"""What a workflow is, before anything runs: the models, the file front end (YAML/JSON,
libyaml's fast path, source positions), CEL and its cost bounds, the graph algorithms,
reducers and state checks, the node-kind protocol, the static checks and the frozen
plan, callables and signatures, the bounds on what is read, Mermaid/DOT rendering.
Layers 0-3 (tests/test_layers.py): nothing here imports the engine, a store or a run.
"""
