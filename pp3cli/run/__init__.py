"""How a command runs: settings, errors and exit codes, the guard, scratch, detaching."""
