"""Load a report.html in headless Chromium and check it the way a person would: no console errors, every
player present and playing with all its views on the same frame, seeking moves them together, and a
screenshot that is not blank."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np

from sagegen.report.browser import Browser

_STATE = """(function(){return window.sagegenPlayers.map(function(p){return {id:p.id,n:p.n,frame:p.frame,
playing:p.playing,views:p.canvases.map(function(c){\
return c.dataset.frame===undefined?null:+c.dataset.frame;})};});})()"""


def screenshot_stats(png: bytes) -> dict:
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32)
    return {"width": int(a.shape[1]), "height": int(a.shape[0]), "std": float(a.std()),
            "colors": int(len(np.unique(a.reshape(-1, 3)[:: max(1, a.size // 3 // 200000)], axis=0)))}


def check_report(html: str | Path, screenshot: str | Path | None = None, play_s: float = 1.0) -> dict:
    html = Path(html).resolve()
    out: dict = {"problems": []}
    with Browser() as b:
        b.open(html.as_uri())
        out["players"] = b.eval("window.sagegenPlayers ? window.sagegenPlayers.length : -1")
        out["videos_or_images"] = b.eval("document.querySelectorAll('canvas.sg-view, .views img').length")
        if out["players"] > 0:
            b.eval("Promise.all(window.sagegenPlayers.map(function(p){return p.ready;}))")
            before = b.eval(_STATE)
            b.eval("document.getElementById('sg-play-all').click()")
            time.sleep(play_s)
            during = b.eval(_STATE)
            b.eval("document.getElementById('sg-play-all').click()")  # pause all
            after_pause = b.eval(_STATE)
            time.sleep(0.3)
            still = b.eval(_STATE)
            b.eval("window.sagegenPlayers.forEach(function(p){p.seek(Math.floor(p.n/2));})")
            seeked = b.eval(_STATE)
            out.update(before=before, during=during, paused=after_pause, still=still, seeked=seeked)
            out["played"] = all(d["playing"] and (d["frame"] != s["frame"] or d["n"] == 1)
                                for d, s in zip(during, before))
            out["paused_ok"] = (all(not p["playing"] for p in still)
                                and [p["frame"] for p in still] == [p["frame"] for p in after_pause])
            out["in_sync"] = all(len(set(p["views"])) == 1 and p["views"][0] == p["frame"]
                                 for st in (during, still, seeked) for p in st)
            out["seek_ok"] = all(p["frame"] == p["n"] // 2 for p in seeked)
            out["gain_ok"] = b.eval("""(function(){var g=document.querySelector('input.sg-gain'); g.value='4';
                g.dispatchEvent(new Event('input'));
                var c=g.closest('.player').querySelector('canvas.sg-diff'); \
return c.style.filter === 'brightness(4)';})()""")
        png = b.screenshot()
        out["problems"] = b.console_problems()
    out["screenshot"] = screenshot_stats(png)
    if screenshot is not None:
        from sagegen.runs.directory import atomic_write_bytes

        atomic_write_bytes(screenshot, png)
    return out
