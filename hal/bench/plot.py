"""`hal bench moe --plot FILE.png`: time against tokens for every variant, with the roofline's floor
and each point's p10-p90 band, one panel per routing. matplotlib is an optional extra."""

from __future__ import annotations


def require_matplotlib() -> None:
    """A ValueError naming --plot when matplotlib is not installed, before any timing is done."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, an optional extra: pip install 'moe-hal[plot]' "
                         "(or pip install matplotlib)") from None


def plot_moe(result, path: str) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    routings = sorted({r.routing for r in result.rows})
    fig, axes = plt.subplots(1, len(routings), figsize=(6.5 * len(routings), 4.8), squeeze=False)
    s = result.spec
    for ax, routing in zip(axes[0], routings, strict=True):
        rows = [r for r in result.rows if r.routing == routing]
        for variant in dict.fromkeys(r.variant for r in rows):
            mine = sorted((r for r in rows if r.variant == variant), key=lambda r: r.tokens)
            tokens = [r.tokens for r in mine]
            ax.plot(tokens, [r.timing.median_s * 1e6 for r in mine], marker="o", label=variant)
            ax.fill_between(tokens, [r.timing.p10_s * 1e6 for r in mine],
                            [r.timing.p90_s * 1e6 for r in mine], alpha=0.2)
        floor = {r.tokens: r.floor_s * 1e6 for r in rows}
        ax.plot(sorted(floor), [floor[t] for t in sorted(floor)], "k--", label="roofline (floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("time per call (us): median, p10-p90 band")
        ax.set_title(f"{routing} routing")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    title = (f"{s.weight_format} E={s.num_experts} top_k={s.top_k} H={s.hidden_size} "
             f"I={s.intermediate_size} on {result.device}")
    if result.noise:
        title += "\nWARNING: a noisy machine (the table says why)"
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
