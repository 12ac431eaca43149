"""polyspec.core: the leaf package every other part builds on. It imports nothing of polyspec's.

Settings, the error hierarchy, the acceptance arithmetic, atomic file writes, language codes,
live counters, prompt reading and domain detection each have their one home here.
"""
