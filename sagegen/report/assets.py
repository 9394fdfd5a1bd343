"""The inline CSS and JavaScript of report.html (no external resources, so it opens from disk)."""

CSS = r"""
:root{--bg:#fafafa;--fg:#1d1d1f;--muted:#666;--card:#fff;--line:#ddd;--good:#1a7f37;--bad:#c62828}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;""" \
r"""background:var(--bg);color:var(--fg)}
header{padding:18px 24px;background:#15171a;color:#f3f3f3}
header h1{margin:0 0 4px;font-size:20px}
header .sub{color:#b8b8b8;font-size:13px;word-break:break-all}
main{padding:16px 24px;max-width:1500px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 10px}
h3{font-size:15px;margin:0 0 6px}
table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #eee;padding:4px 10px;text-align:right;vertical-align:top}
th:first-child,td:first-child,td:last-child:not(:nth-child(-n+4)){text-align:left}
th{background:#f4f4f6;font-weight:600}
.kv td{text-align:left}
.kv td:first-child{color:var(--muted);white-space:nowrap}
.good{color:var(--good)}.bad{color:var(--bad)}.muted{color:var(--muted)}
.warn{color:#8a5a00;background:#fff8e1;border:1px solid #f3d37a;border-radius:4px;""" \
r"""padding:4px 8px;margin:4px 0;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:16px}
.row-head{display:flex;justify-content:space-between;gap:12px;align-items:baseline;flex-wrap:wrap}
.prompt{font-weight:600}
.views{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.view{display:flex;flex-direction:column;align-items:center}
.view .lbl{font-size:12px;color:var(--muted);margin-bottom:3px}
.view canvas,.view img{background:#111;border-radius:4px;max-width:100%;image-rendering:auto}
.controls{display:flex;align-items:center;gap:10px;margin:4px 0 8px}
.controls button{font:inherit;padding:3px 12px;border:1px solid #bbb;border-radius:4px;""" \
r"""background:#f6f6f6;cursor:pointer;min-width:70px}
.controls input[type=range]{flex:1;max-width:520px}
.controls .fc{font-variant-numeric:tabular-nums;color:var(--muted);min-width:90px}
.plot{margin-top:4px}
.plot svg{background:#fcfcfd;border:1px solid #eee;border-radius:4px}
details summary{cursor:pointer;color:var(--muted)}
details.skipped{margin:0 0 10px}details.skipped summary{color:#8a5a00}
.controls label{display:flex;align-items:center;gap:6px;font-size:12px}.controls input.sg-gain{width:90px}
a{color:#0b57d0}
"""

JS = r"""
(function(){
  "use strict";
  var data = JSON.parse(document.getElementById("sg-data").textContent);
  var players = [];
  window.sagegenPlayers = players;
  function Player(root, spec){
    var self = this;
    self.id = spec.id; self.n = spec.n; self.fps = spec.fps; self.frame = 0; self.playing = false;
    self.step = spec.step || 1; self.total = spec.total || spec.n;  // players may show every step-th frame
    self.canvases = Array.prototype.slice.call(root.querySelectorAll("canvas.sg-view"));
    self.images = spec.views.map(function(v){ return v.map(function(uri){ """ \
r"""var im = new Image(); im.src = uri; return im; }); });
    self.btn = root.querySelector("button.sg-play");
    self.slider = root.querySelector("input.sg-seek");
    self.counter = root.querySelector(".fc");
    self.cursor = document.querySelector('line.sg-cursor[data-id="' + spec.id + '"]');
    self.ready = Promise.all([].concat.apply([], self.images).map(function(im){ return im.decode(); }));
    self.ready.then(function(){ self.draw(); }, function(err){ console.warn("frame decode failed", err); });
    self.gain = root.querySelector("input.sg-gain");
    self.gainVal = root.querySelector(".sg-gain-val");
    if (self.gain) self.gain.addEventListener("input", function(){
      var k = parseInt(self.gain.value, 10) || 1;
      root.querySelectorAll("canvas.sg-diff").forEach(function(c){ """ \
r"""c.style.filter = k > 1 ? "brightness(" + k + ")" : ""; });
      self.gainVal.textContent = "\u00d7" + k;
    });
    self.btn.addEventListener("click", function(){ self.playing ? self.pause() : self.play(); });
    self.slider.addEventListener("input", function(){ self.seek(parseInt(self.slider.value, 10)); });
  }
  Player.prototype.draw = function(){
    var f = this.frame, self = this;
    this.canvases.forEach(function(c, k){
      var im = self.images[k][f];
      if (!im.complete) return;
      var ctx = c.getContext("2d");
      ctx.drawImage(im, 0, 0, c.width, c.height);
      c.dataset.frame = String(f);
    });
    this.slider.value = String(f);
    this.counter.textContent = "frame " + (f * this.step + 1) + " / " + this.total;  // real frame numbers
    if (this.cursor){
      var x0 = parseFloat(this.cursor.dataset.x0), dx = parseFloat(this.cursor.dataset.dx);
      var x = x0 + dx * f * (this.cursor.dataset.step ? parseFloat(this.cursor.dataset.step) : 1);
      this.cursor.setAttribute("x1", x); this.cursor.setAttribute("x2", x);
    }
  };
  Player.prototype.seek = function(f){
    this.frame = Math.max(0, Math.min(this.n - 1, f | 0));
    this.draw();
  };
  Player.prototype.play = function(){
    if (this.playing) return;
    this.playing = true; this.btn.textContent = "Pause";
    var self = this, period = 1000 / this.fps, last = performance.now();
    function tick(){
      if (!self.playing) return;
      var now = performance.now();
      if (now - last >= period){ last = now; self.frame = (self.frame + 1) % self.n; self.draw(); }
      self.timer = setTimeout(tick, Math.max(4, period / 4));
    }
    this.timer = setTimeout(tick, period);
  };
  Player.prototype.pause = function(){
    this.playing = false; this.btn.textContent = "Play";
    clearTimeout(this.timer);
  };
  data.players.forEach(function(spec){
    var root = document.getElementById("player-" + spec.id);
    if (root) players.push(new Player(root, spec));
  });
  var all = document.getElementById("sg-play-all");
  if (all) all.addEventListener("click", function(){
    var any = players.some(function(p){ return !p.playing; });
    players.forEach(function(p){ any ? p.play() : p.pause(); });
    all.textContent = any ? "Pause all" : "Play all";
  });
})();
"""
