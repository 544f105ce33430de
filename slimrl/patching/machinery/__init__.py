"""How a patch is declared, installed, guarded and checked, knowing nothing of any trainer: the registry
(``registry.py``, installing through :mod:`slimrl.compat.runtime.swaps`), the contracts of the methods slimrl replaces
(``contracts.py`` + ``contracts.json``), the fingerprints of the ones it re-computes (``fingerprints.py`` +
``fingerprints.json``), the self-check that runs on a TRL release newer than the tests (``self_check.py``), and the
catalog of the trainers the installed TRL ships (``catalog.py``)."""
