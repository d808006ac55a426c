"""The execution layer of ``convert`` and ``augment``: a run as shard tasks.

- :mod:`.shards` plans the tasks from the entry list before any data moves (sizes, names);
- :mod:`.journal` keeps a record of every committed shard in the staging folder (``--resume``);
- :mod:`.units` holds the work units, one per (media, device), that turn a task's entries into its
  output records; :mod:`.strategies` is the one table that picks a unit and how many workers run it;
- :func:`.worker.run_shard` runs one task with a unit, writes and commits its shard and journals it;
- :mod:`.local` runs the tasks in worker processes (one per core, or per GPU), in order of shard names.
- :mod:`.early` starts a GPU run's worker processes before the run needs them (its GPUs' start beside the
  command's own).

Output bytes do not depend on the number of workers or on timing: every shard's records, names and
parameters follow from the plan and the record keys alone.
"""
