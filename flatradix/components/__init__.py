"""Component rules: Full, SWA and Mamba, each in its own module, reached through one
dispatch module.

* ``full.py``: the backbone every node holds (a value per unit, the path lock); the
  tree core calls its rules itself, on every path (no dispatch on the hot paths of
  a Full-only cache).
* ``swa.py``, ``mamba.py``: the auxiliary components, each with its device rules,
  its host-tier rules (backup and load-back plans of its own data, host LRU, host
  locks) and its own entry kernels (``swa_backup_plan``, ``swa_load_plan``,
  ``swa_host_hit``; ``finish_state_eviction``, ``path_cap``), under SGLang 0.5.23's
  hook names where SGLang has one (``unified_cache/components/*.py``).
* ``dispatch.py``: the hooks the tree core (``flatradix/core/``) calls -- match
  validation, insert overlap and commit (a component asks for a split: it never
  splits a node itself), split, device and host data of a deleted or demoted node,
  locks on both tiers, eviction of one victim, write-back state backups, the
  sanity check -- each chained, at compile time, over the components listed in
  ``dispatch.COMPONENTS`` that define a rule of that name, with one signature per
  hook. See its docstring for the hooks and how a chain combines its rules'
  answers.

Layering: the components import the array primitives (``flatradix/kernels/``) and
nothing above; the tree core imports the components (Full directly, the others
through ``dispatch``); the kernels never import either.
"""
