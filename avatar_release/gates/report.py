"""The gate report: one self-contained HTML page plus the result JSON.

Shows every gate's verdict and evidence, sample frames (baseline, candidate, diff heat map;
none while a blind review of the result is open) and a per-frame PSNR plot against the band
floor. Images are embedded as data URIs, so the folder can be archived as a CI artifact and
opened anywhere.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import numpy as np

from .. import _atomic
from ..media import encode_png
from ..records import GateResult
from ._compare import frame_label, per_frame_psnr
from .metrics import metric_name

__all__ = ["heatmap", "psnr_plot_svg", "write_report", "png_data_uri"]


def heatmap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| as an RGB picture: black = equal; dark red .. yellow .. white = the largest difference.

    Scaled to the largest difference in the frame (at least 1), so a single-level change is
    fully visible; the caption states the scale.
    """
    d = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=-1).astype(np.float32)
    t = d / max(float(d.max()), 1.0)
    r = np.clip(t * 3.0, 0, 1)
    g = np.clip(t * 3.0 - 1.0, 0, 1)
    bl = np.clip(t * 3.0 - 2.0, 0, 1)
    rgb = np.stack([r, g, bl], axis=-1)
    rgb[d > 0] = np.maximum(rgb[d > 0], [0.35, 0.0, 0.0])  # any difference at all stays visible
    return (rgb * 255).round().astype(np.uint8)


def png_data_uri(rgb: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(encode_png(rgb)).decode()


def psnr_plot_svg(
    psnrs: list[float],
    floor: float | None,
    boundaries: list[int],
    *,
    width: int = 760,
    height: int = 220,
    metric: str = "PSNR",
    unit: str = "frame",
) -> str:
    """Per-frame PSNR (or another ``metric`` per ``unit``: SNR per chunk of an audio or tensors build)
    as an SVG polyline; identical units drawn at the top as 'identical'."""
    finite = [p for p in psnrs if not math.isinf(p)] + ([floor] if floor else [])
    top = (max(finite) if finite else 60.0) + 1.5
    bottom = (min(finite) if finite else 40.0) - 1.5
    bottom = min(bottom, top - 4.0)  # at least a 4 dB window
    ml, mr, mt, mb = 46, 10, 18, 26
    W, H = width - ml - mr, height - mt - mb
    n = max(len(psnrs) - 1, 1)

    def x(i: float) -> float:
        return ml + W * i / n

    def y(v: float) -> float:
        v = top if math.isinf(v) else v
        return mt + H * (top - v) / (top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="per-{unit} {metric}">',
        f'<rect x="{ml}" y="{mt}" width="{W}" height="{H}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for k in range(5):
        v = bottom + (top - bottom) * k / 4
        parts.append(f'<text x="{ml - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.1f}</text>')
    for bnd in boundaries:
        parts.append(f'<line x1="{x(bnd):.1f}" y1="{mt}" x2="{x(bnd):.1f}" y2="{mt + H}" stroke="#ddd"/>')
    if floor is not None:
        parts.append(
            f'<line x1="{ml}" y1="{y(floor):.1f}" x2="{ml + W}" y2="{y(floor):.1f}" '
            f'stroke="#c00" stroke-dasharray="4 3"/>'
        )
        parts.append(
            f'<text x="{ml + W - 4}" y="{y(floor) - 4:.1f}" font-size="10" fill="#c00" '
            f'text-anchor="end">band floor {floor:.2f} dB</text>'
        )
    pts = " ".join(f"{x(i):.1f},{y(p):.1f}" for i, p in enumerate(psnrs))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#246" stroke-width="1.5"/>')
    for i, p in enumerate(psnrs):
        colour = "#2a2" if math.isinf(p) else ("#c00" if floor is not None and p < floor else "#246")
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(p):.1f}" r="2" fill="{colour}"/>')
    parts.append(
        f'<text x="{ml}" y="{height - 6}" font-size="10">{unit} (gate-set order); '
        f"{metric} dB vs baseline; identical {unit}s at the top in green</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.passed{color:#070}.failed,.below-band{color:#b00}.skipped{color:#777}.needs-review{color:#a60}
img.frame{width:240px;image-rendering:pixelated;border:1px solid #ccc}
code{background:#f4f4f4;padding:1px 3px}
"""


def _samples(cand: np.ndarray, scores: list[float] | None, limit: int = 4) -> list[int]:
    if scores is None:
        return [int(i) for i in np.linspace(0, len(cand) - 1, num=min(limit, len(cand)))]
    order = sorted(range(len(scores)), key=lambda i: scores[i])  # worst first
    return sorted(order[:limit])


def write_report(
    folder: str | Path,
    result: GateResult,
    result_digest: str,
    cand: np.ndarray,
    base: np.ndarray | None,
    *,
    review_page: str | None = None,
) -> Path:
    """Write ``index.html`` and ``result.json`` into ``folder``; returns the HTML path.

    ``review_page``: a blind review of this result is open (the link to its page); the report
    then shows no labelled frames and no heat maps, only verdicts and the PSNR plot.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _atomic.write_json(folder / "result.json", result.model_dump(mode="json"), sort_keys=False)
    e = html.escape
    body = _summary(result, result_digest)
    if review_page:
        body.append(
            f'<p class="needs-review">Below the band: answer the <a href="{e(review_page)}">blind '
            f"review</a> (served by <code>avatar-release review {e(result.build_id)} --serve</code>).</p>"
        )
    scores = per_frame_psnr(cand, base) if base is not None else None  # once, for the plot and the samples
    if scores is not None:
        body += _plot(result, cand, scores)
    if review_page:
        # An open blind review: a labelled baseline/candidate frame (or its heat map) next to the
        # unlabelled pairs would tell a reviewer which side is which. Shown after the decision.
        body.append(
            "<h2>Sample frames</h2><p>Sealed while the blind review is open: labelled baseline and "
            "candidate frames and their difference heat maps are not in this report. After the decision, "
            f"<code>avatar-release review {e(result.build_id)}</code> reveals which side was the candidate "
            "in each pair, and a later gate report shows the frames.</p>"
        )
    elif cand.dtype == np.uint8:  # pictures of video frames; an audio or tensors build has only the plot
        body += _sample_frames(result, cand, base, scores)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Gate report {e(result.build_id)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    out = folder / "index.html"
    _atomic.write_text(out, page)
    return out


def _summary(result: GateResult, result_digest: str) -> list[str]:
    """The report's head: the verdict, what was gated against what, where, and each gate's evidence."""
    e = html.escape
    rows = "".join(
        f'<tr><td>{e(g.name)}</td><td class="{e(g.status)}">{e(g.status)}</td><td>{e(g.summary)}</td></tr>'
        for g in result.gates
    )
    base_txt = (
        f"{e(result.baseline.build_id)} <code>{e(result.baseline.digest)}</code>"
        if result.baseline
        else "none (first build: zero-recompile and twin gates only)"
    )
    tier_txt = (f"tier {result.tier}: " + e("; ".join(result.tier_reasons))) if result.tier else "—"
    return [
        f"<h1>Gate report: {e(result.build_id)}</h1>",
        f'<p>Status: <b class="{e(result.status)}">{e(result.status)}</b></p>',
        "<table>",
        f"<tr><th>build</th><td><code>{e(result.build_digest)}</code></td></tr>",
        f"<tr><th>baseline</th><td>{base_txt}</td></tr>",
        f"<tr><th>tier</th><td>{tier_txt}</td></tr>",
        f"<tr><th>gate set</th><td>{e(result.gate_set.name)} v{result.gate_set.version}: "
        f"{len(result.gate_set.requests)} requests, {result.gate_set.frames} frames "
        f"<code>{e(result.gate_set.digest)}</code></td></tr>",
        f"<tr><th>environment</th><td>{e(result.environment.backend)} {e(result.environment.device_kind)} "
        f"x{result.environment.device_count}, jaxlib {e(result.environment.jaxlib)} "
        f"<code>{e(result.environment.fingerprint)}</code></td></tr>",
        f"<tr><th>result</th><td><code>{e(result_digest)}</code> (result.json)</td></tr>",
        "</table>",
        "<h2>Gates</h2><table><tr><th>gate</th><th>status</th><th>evidence</th></tr>",
        rows,
        "</table>",
    ]


def _plot(result: GateResult, cand: np.ndarray, psnrs: list[float]) -> list[str]:
    """Per-frame PSNR (per-chunk SNR for an audio or tensors build) against the band's floor."""
    video = cand.dtype == np.uint8  # else an audio or tensors build's delivered chunks
    bounds, k = [], 0
    for r in result.gate_set.requests[:-1]:
        k += r.frames if video else len(r.buckets)
        bounds.append(k)
    band = result.band_used()
    floor = band.psnr_floor_db if band is not None else None
    return [
        f"<h2>Per-{'frame' if video else 'chunk'} {metric_name(cand)} vs baseline</h2>",
        psnr_plot_svg(psnrs, floor, bounds, metric=metric_name(cand), unit="frame" if video else "chunk"),
    ]


def _sample_frames(
    result: GateResult, cand: np.ndarray, base: np.ndarray | None, scores: list[float] | None
) -> list[str]:
    """The worst frames (or evenly spread ones without a baseline), labelled, with heat maps."""
    e = html.escape
    body = []
    body.append(
        "<h2>Sample frames</h2><table><tr><th>frame</th>"
        + ("<th>baseline</th><th>candidate</th><th>difference</th>" if base is not None else "<th>candidate</th>")
        + "</tr>"
    )
    for i in _samples(cand, scores):
        cells = [f"<td>{e(frame_label(result.gate_set, i))}</td>"]
        if base is not None:
            d = int(np.abs(cand[i].astype(np.int16) - base[i].astype(np.int16)).max())
            cells.append(f'<td><img class="frame" src="{png_data_uri(base[i])}"></td>')
            cells.append(f'<td><img class="frame" src="{png_data_uri(cand[i])}"></td>')
            cells.append(
                f'<td><img class="frame" src="{png_data_uri(heatmap(cand[i], base[i]))}">'
                f"<br>max abs diff {d} (white = {max(d, 1)})</td>"
            )
        else:
            cells.append(f'<td><img class="frame" src="{png_data_uri(cand[i])}"></td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    body.append("</table>")
    return body
