"""bpe_core: exact, fast, RAM-budgeted byte-level BPE.

This is the public API.
"""
__version__ = "0.1.0"
