"""What every patched trainer gets, whatever its row: slimrl's config fields (declared, added, validated, read
through one typed record), the ``__init__`` and step wrappers, per-trainer state, the self-check's policy
(``preflight``), legacy keywords and moved names, defaults for what this machine cannot run, the reward and
non-finite guards. Below the routes, the online layer and the trainer rows; above the machinery."""
