"""The remote tier: plugin contracts (RSM, RLMM), the object layout, and the built-in plugins."""
