"""`pp3 probe`: the selector's cost against its peers, on identical inputs, in CUDA graphs."""
