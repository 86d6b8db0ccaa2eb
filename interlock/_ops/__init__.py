"""Operations on stored runs, from the stored definition and without the facade:
drive (claim, lease, cancel watch), resume, status, trace, verify, fork, cancel;
export and verify of a file, retention (prune), each node visit as a reader sees
it. Layer 8 (tests/test_layers.py).
"""
