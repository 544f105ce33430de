"""How slimrl behaves in the user's process, beside the facts about the installed stack that the rest of
:mod:`slimrl.compat` holds: warnings and refusals at the user's line (``callsite.py``), glibc malloc tuning
(``malloc.py``), CPU threads (``threads.py``), child processes (``processes.py``), environment flags (``env.py``),
out-of-memory detection (``allocation_errors.py``), bitsandbytes' notices (``bnb_notice.py``) and the one way an
attribute of another module is swapped and restored (``swaps.py``)."""
