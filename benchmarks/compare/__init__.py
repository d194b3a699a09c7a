"""CPU comparison of jgnn with what users would write instead: hand-written JAX, jraph's models and PyG.

``python -m benchmarks.compare --suite cpu`` (the full table; see ``cli.py``) or ``--quick`` (CI smoke tier).
"""
