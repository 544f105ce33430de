"""How a patch is declared, installed, guarded and checked, knowing nothing of any trainer: the registry
(``registry.py``, installing through :mod:`slimrl.compat.runtime.swaps`), the contracts of the methods slimrl replaces
(``contracts.py`` + ``contracts.json``), the fingerprints of the ones it re-computes (``fingerprints.py`` +
``fingerprints.json``), what a method reaches and whether its code is its source (``reach.py``), and the catalog of
the trainers the installed TRL ships (``catalog.py``). The self-check's policy (when to run which rows) is
:mod:`slimrl.patching.every_trainer.preflight`."""
