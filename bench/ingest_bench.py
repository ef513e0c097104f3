"""End-to-end: sustained continuous ingest with compactions keeping up (issue 7 §4).

Reports entries/s ingested, compactions/s, and average files per tablet over time, which should
settle near what the ratio predicts (about log_ratio of the flushes per tablet, bounded by
maxFilesPerTablet) — like the "Files Per Tablet" plot of seed 004. Writes a CSV and a PNG."""

from __future__ import annotations

import argparse

from bench.common import OUT, write_csv


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--tablets", type=int, default=4)
    args = ap.parse_args(argv)
    from kompaktor.local.demo import DemoOptions, run_demo

    res = run_demo(DemoOptions(entries=args.entries, duration_s=args.duration, tablets=args.tablets, live=False))
    rows = [
        {"seconds": t, "entries": e, "avg_files_per_tablet": round(f, 3), "compactions": c}
        for t, e, f, c in res.samples
    ]
    path = write_csv("ingest.csv", rows)
    s = res.summary
    wall = s["wall time (s)"]
    comps = sum(v for k, v in s.items() if k.startswith("compactions run"))
    print(
        f"ingest: {s['entries written']:,} entries at {s['ingest rate (entries/s)']:,} entries/s; "
        f"{comps} compactions in {wall}s ({comps / wall:.2f}/s); files per tablet max during ingest "
        f"{s['max files per tablet during ingest']}, after {s['files per tablet after (max)']}; "
        f"verified {s['verified']}; CSV {path}"
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot([r["seconds"] for r in rows], [r["avg_files_per_tablet"] for r in rows], label="avg files/tablet")
        ax.set_xlabel("seconds")
        ax.set_ylabel("files per tablet")
        ax2 = ax.twinx()
        ax2.plot(
            [r["seconds"] for r in rows],
            [r["entries"] for r in rows],
            color="tab:gray",
            alpha=0.5,
            label="entries ingested",
        )
        ax2.set_ylabel("entries")
        ax.set_title("Kompaktor continuous ingest: files per tablet over time")
        fig.tight_layout()
        fig.savefig(OUT / "ingest.png", dpi=100)
        print(f"plot: {OUT / 'ingest.png'}")
    except ImportError:
        print("matplotlib not installed: no plot")
    if s["verified"] != "yes":
        raise SystemExit("end-to-end benchmark did not verify")
    return rows


if __name__ == "__main__":
    main()
