"""``python -m slimrl.patching``: print every patch slimrl declares; ``--record-contracts``: add the installed TRL's
signatures of the methods slimrl replaces to ``contracts.json`` (:mod:`slimrl.patching.machinery.contracts`) and the
fingerprints of the ones it re-computes to ``fingerprints.json`` (:mod:`slimrl.patching.machinery.fingerprints`)."""

import sys

from slimrl.patching import describe

if __name__ == "__main__":
    if sys.argv[1:] == ["--record-contracts"]:
        from slimrl.compat.trl_info import trl_version
        from slimrl.patching.machinery import fingerprints
        from slimrl.patching.machinery.contracts import RECORD, record, write
        from slimrl.patching.machinery.registry import patches

        data = record(patches(), str(trl_version()))
        write(data)
        codes = fingerprints.record(patches(), str(trl_version()))
        fingerprints.write(codes)
        print(
            f"{RECORD}: {len(data)} contracts, {fingerprints.RECORD.name}: {len(codes)} fingerprints, trl "
            f"{trl_version()} recorded"
        )
        sys.exit(0)
    rows = describe()
    cols = ["algorithm", "target", "attribute", "replacement", "trl", "installed"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols))
