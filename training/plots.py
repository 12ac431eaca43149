"""PNG plots of a training run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import json
from pathlib import Path


def plot_metrics(metrics_path: Path, out_png: Path) -> Path | None:
    """Loss and per-position accuracy (speculators' full_acc_i: acceptance proxies) against the step, lr below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(ln) for ln in metrics_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    ax_loss.plot(steps, [r["loss"] for r in rows], color="black", label="loss")
    ax_loss.set_ylabel("loss")
    ax_acc = ax_loss.twinx()
    for i in range(8):
        key = f"full_acc_{i}"
        if key in rows[0]:
            ax_acc.plot(steps, [r.get(key, 0.0) for r in rows], alpha=0.7, label=f"acc pos {i + 1}")
    ax_acc.set_ylabel("accuracy (acceptance proxy)")
    ax_acc.set_ylim(0, 1)
    handles = ax_loss.get_legend_handles_labels()[0] + ax_acc.get_legend_handles_labels()[0]
    ax_loss.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=8)
    ax_lr.plot(steps, [r["lr"] for r in rows], color="tab:gray")
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("step")
    fig.suptitle(f"draft training ({len(rows)} steps)")
    fig.tight_layout()
    tmp = out_png.with_name(f".{out_png.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out_png)
    return out_png
