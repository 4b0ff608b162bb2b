"""Evidence that a verifier is lossless: exact laws, statistics, qualify, oracle, edge battery."""
