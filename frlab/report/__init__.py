"""`python -m frlab.report`: run folders -> arms, statistics across seeds, tables and plots.

Reads only run folders (metrics.csv, summary.json, .hydra/) and imports nothing of training.
The statistics come from rliable and scipy (the `report` extra): see frlab.report.stats.
"""
