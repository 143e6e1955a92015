"""One training run's lifecycle around `frlab.train.run`: its folder and its record.

- `frlab.run.machine`: before a real run, whether this machine has what the config needs
  (devices, model and data sources), offline and in well under a second;
- `frlab.run.folder`: one run per folder (a new run never writes over another's files), no
  leftovers of killed writes, and which checkpoint a resume starts from;
- `frlab.run.hydra_record`: the Hydra callback that keeps an earlier launch's `.hydra/`
  record (or refuses the launch) before Hydra writes a new one;
- `frlab.run.guard`: the run's guard: prepare the folder and the resume checkpoint, stop on
  SIGINT / SIGTERM at a safe point with a final checkpoint, and the exit codes.

The stop request itself (`frlab.stop`) stays a leaf module: the data module and the run files
wait on it without depending on the guard.
"""
