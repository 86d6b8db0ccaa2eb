"""The node kinds shipped beside a plain call, plug-ins on the node call through
`_definition._kinds.NodeKind`: `workflow:` (`_subflow`) here, `agent:` in the
public `interlock.agents`; `_compile` wires them into validation and the plan.
Layers 6-7 (tests/test_layers.py).
"""
