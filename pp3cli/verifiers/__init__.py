"""The verifiers pp3 runs and judges: its own, planted-defect controls, and peers' samplers."""
