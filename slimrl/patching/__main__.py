"""``python -m slimrl.patching``: print every patch slimrl declares; ``--record-contracts``: add the installed TRL's
signatures of the methods slimrl replaces to ``contracts.json`` (:mod:`slimrl.patching.contracts`)."""

import sys

from slimrl.patching import describe

if __name__ == "__main__":
    if sys.argv[1:] == ["--record-contracts"]:
        from slimrl.compat.trl_info import trl_version
        from slimrl.patching.contracts import RECORD, record, write
        from slimrl.patching.registry import patches

        data = record(patches(), str(trl_version()))
        write(data)
        print(f"{RECORD}: {len(data)} contracts, trl {trl_version()} recorded")
        sys.exit(0)
    rows = describe()
    cols = ["algorithm", "target", "attribute", "replacement", "trl", "installed"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols))
