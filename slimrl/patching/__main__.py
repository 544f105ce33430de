"""``python -m slimrl.patching``: print every patch slimrl declares."""

from slimrl.patching import describe

if __name__ == "__main__":
    rows = describe()
    cols = ["algorithm", "target", "attribute", "replacement", "trl", "installed"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols))
