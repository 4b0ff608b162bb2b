"""Receipts: writing in-toto Statements, the hash-chained manifest, and verifying both."""
