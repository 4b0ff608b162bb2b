"""The command line: a thin Typer app; one module per command, one skeleton for all receipts."""
