"""pp3: prove a GPU speculative-decoding verifier exactly lossless, and make it fast."""

__version__ = "0.1.0"
