/* Switchyard benchmark curves: latency against throughput, drawn with uPlot (static/vendor/uplot/).
 *
 * Every <div class="bench-curve" data-source="ID" data-height="300"> draws the JSON of the
 * <script type="application/json" id="ID"> on the page:
 *   {"slo_p99_ms": ms|null, "series": [{"key", "label", "best": bool, "max_load_rps": x|null,
 *     "points": [{"rps", "p50", "p99", "value", "passes"}]}]}
 * x is the throughput a level carried (req/s), y its latency (ms): p99 solid, p50 dashed, one
 * Okabe-Ito colour per series; the p99 SLO is a dash-dot line with its label, and the best
 * series' max load within the SLO a dotted vertical mark.
 *
 * While a job runs, htmx swaps the live part (and the JSON in it) every second; the chart is
 * redrawn after each swap when the JSON changed, so the curve grows level by level.
 */
(function () {
  "use strict";

  // Okabe-Ito without yellow and black, as latency.js (the SLO line is ink).
  var PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"];
  var DASH_P50 = [6, 4];
  var DASH_SLO = [12, 4, 2, 4];
  var charts = new Map();  // element → {plot, text}

  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function num(v) { return v == null || v === "" || !isFinite(v) ? null : Number(v); }

  function fmt(v, unit) {
    v = num(v);
    if (v == null) return "–";
    return v.toFixed(Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) + " " + unit;
  }

  function readData(el) {
    var src = document.getElementById(el.dataset.source);
    if (!src) return null;
    try { return { text: src.textContent, data: JSON.parse(src.textContent) }; }
    catch (e) { return null; }
  }

  // uPlot wants one shared, ascending x: join the series on their req/s (gaps spanned).
  function build(data) {
    var series = (data.series || []).filter(function (s) { return (s.points || []).length; });
    var tables = series.map(function (s) {
      var pts = s.points.slice().sort(function (a, b) { return a.rps - b.rps; });
      var xs = [], p99 = [], p50 = [], seen = new Set();
      pts.forEach(function (p) {
        if (seen.has(p.rps)) return;   // two levels at the very same req/s: keep the first
        seen.add(p.rps);
        xs.push(p.rps); p99.push(num(p.p99)); p50.push(num(p.p50));
      });
      return [xs, p99, p50];
    });
    var aligned = tables.length ? uPlot.join(tables) : [[]];
    // The lines join the levels in load order (the data comes ordered by level), so a level
    // that carried less than the one before bends the curve back instead of hiding it.
    var lines = [];
    series.forEach(function (s, i) {
      var colour = PALETTE[i % PALETTE.length];
      var along = function (field) {
        return s.points.map(function (p) { return [num(p.rps), num(p[field])]; })
          .filter(function (xy) { return xy[0] != null && xy[1] != null; });
      };
      lines.push({ label: s.label + " p99", colour: colour, dash: false, along: along("p99") });
      lines.push({ label: s.label + " p50", colour: colour, dash: true, along: along("p50") });
    });
    var x = aligned[0];
    var slo = num(data.slo_p99_ms);
    var dmax = 0;
    for (var i = 1; i < aligned.length; i++) {
      for (var j = 0; j < x.length; j++) if (aligned[i][j] != null && aligned[i][j] > dmax) dmax = aligned[i][j];
    }
    var ytop = dmax > 0 ? dmax * 1.15 : 1;
    if (slo != null && slo > 0 && (dmax <= 0 || slo <= dmax * 3)) ytop = Math.max(ytop, slo * 1.15);
    // x from 0: a saturated server shows as the wall it is (latency rising at one req/s),
    // not as noise blown up across the plot.
    var hi = x.length ? x[x.length - 1] : 1;
    var xmin = 0;
    var xmax = Math.max(hi, 1) * 1.08;
    var best = series.filter(function (s) { return s.best && num(s.max_load_rps) != null; })[0];
    return { lines: lines, data: aligned, ytop: ytop, xmin: xmin, xmax: xmax, slo: slo,
             mark: best && series.length ? { x: num(best.max_load_rps), label: "max load within SLO" } : null };
  }

  function options(el, b) {
    var px = uPlot.pxRatio || 1;
    var ink = cssVar("--ink", "#1c2330"), muted = cssVar("--muted", "#5b6472");
    var grid = cssVar("--line", "#dde1e7");
    var font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    var scaled = function (d) { return d.map(function (v) { return v * px; }); };
    var value = function (u, v, si, idx) {
      if (idx == null) return "–";
      return fmt(v, "ms");
    };
    var series = [{ label: "Throughput", value: function (u, v, si, idx) {
      return idx == null ? "hover a point" : fmt(v, "req/s");
    } }];
    b.lines.forEach(function (l) {
      series.push({ label: l.label, stroke: l.colour, width: l.dash ? 1.5 : 2.25,
                    dash: l.dash ? scaled(DASH_P50) : undefined, spanGaps: true, value: value,
                    points: { show: true, size: l.dash ? 4 : 6, fill: l.colour },
                    paths: function (u) { return { stroke: inLoadOrder(u, l.along), fill: null }; } });
    });
    var axis = { stroke: muted, font: font, labelFont: font, grid: { stroke: grid, width: 1 },
                 ticks: { stroke: grid, width: 1 } };
    return {
      width: Math.max(200, el.clientWidth), height: parseInt(el.dataset.height, 10) || 300,
      series: series,
      scales: { x: { time: false, range: function () { return [b.xmin, b.xmax]; } },
                y: { range: function () { return [0, b.ytop]; } } },
      axes: [Object.assign({}, axis, { label: "throughput (req/s)", labelSize: 18 }),
             Object.assign({}, axis, { label: "latency (ms)", labelSize: 18, size: 48 })],
      legend: { live: true, markers: { width: 3, dash: function (u, si) {
        var l = b.lines[si - 1];
        return l && l.dash ? "dashed" : "solid";
      } } },
      cursor: { drag: { x: false, y: false } },
      hooks: { draw: [function (u) { annotate(u, b, ink); }] },
    };
  }

  // A line through the points in load order, in canvas pixels (as uPlot's own paths are).
  function inLoadOrder(u, along) {
    var path = new Path2D();
    along.forEach(function (xy, i) {
      var x = u.valToPos(xy[0], "x", true), y = u.valToPos(xy[1], "y", true);
      if (i) path.lineTo(x, y); else path.moveTo(x, y);
    });
    return path;
  }

  // The SLO's label on its line, and the max load within the SLO as a dotted vertical mark.
  function annotate(u, b, ink) {
    var ctx = u.ctx, px = uPlot.pxRatio || 1, bb = u.bbox;
    ctx.save();
    ctx.font = Math.round(11 * px) + "px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "left";   // uPlot leaves the axes' alignment on the context
    if (b.slo != null) {
      var y = u.valToPos(b.slo, "y", true);
      if (y >= bb.top) {
        ctx.strokeStyle = ink;
        ctx.lineWidth = 1.5 * px;
        ctx.setLineDash(DASH_SLO.map(function (v) { return v * px; }));
        ctx.beginPath(); ctx.moveTo(bb.left, y); ctx.lineTo(bb.left + bb.width, y); ctx.stroke();
        ctx.setLineDash([]);
      }
      var text = "SLO p99 " + fmt(b.slo, "ms") + (y < bb.top ? " \u2191 above" : "");
      var w = ctx.measureText(text).width, h = 14 * px, pad = 3 * px;
      var top = Math.max(bb.top, y - h - pad), x = bb.left + 2 * pad;
      ctx.fillStyle = "rgba(255,255,255,0.8)";
      ctx.fillRect(x - pad, top, w + 2 * pad, h);
      ctx.fillStyle = ink;
      ctx.fillText(text, x, top + h / 2);
    }
    if (b.mark && b.mark.x != null) {
      var mx = u.valToPos(b.mark.x, "x", true);
      ctx.strokeStyle = ink;
      ctx.lineWidth = px;
      ctx.setLineDash([2 * px, 3 * px]);
      ctx.beginPath(); ctx.moveTo(mx, bb.top); ctx.lineTo(mx, bb.top + bb.height); ctx.stroke();
      ctx.setLineDash([]);
      var label = b.mark.label + " " + fmt(b.mark.x, "req/s");
      var lw = ctx.measureText(label).width;
      // right of the mark, or left of it where it is near the right edge
      var lx = mx + 4 * px + lw > bb.left + bb.width ? mx - lw - 6 * px : mx + 4 * px;
      ctx.fillStyle = "rgba(255,255,255,0.8)";
      // at the bottom, clear of the SLO's label at the top left
      var ly = bb.top + bb.height - 12 * px;
      ctx.fillRect(lx - 2 * px, ly - 7 * px, lw + 4 * px, 14 * px);
      ctx.fillStyle = ink;
      ctx.fillText(label, lx, ly);
    }
    ctx.restore();
  }

  function draw(el) {
    var found = readData(el);
    var state = charts.get(el) || {};
    if (!found || found.text === state.text) return;
    var b = build(found.data);
    if (state.plot) state.plot.destroy();
    el.replaceChildren();
    el.dataset.points = String(b.data[0].length);
    if (!b.lines.length) {
      var note = document.createElement("p");
      note.className = "latency-note";
      note.textContent = "Waiting for the first level…";
      el.append(note);
      charts.set(el, { text: found.text, plot: null });
      return;
    }
    el.setAttribute("role", "figure");
    el.setAttribute("aria-label", "Latency against throughput: " + b.lines.map(function (l) {
      return l.label; }).join(", ") + (b.slo != null ? "; SLO p99 " + fmt(b.slo, "ms") : ""));
    var plot = new uPlot(options(el, b), b.data, el);
    charts.set(el, { text: found.text, plot: plot, width: el.clientWidth });
  }

  function init() {
    if (!window.uPlot) { console.error("benchmark_curve.js: uPlot is not loaded"); return; }
    document.querySelectorAll(".bench-curve[data-source]").forEach(draw);
  }

  var resize = new ResizeObserver(function (entries) {
    entries.forEach(function (e) {
      var st = charts.get(e.target);
      if (st && st.plot && e.target.clientWidth !== st.width) {
        st.width = e.target.clientWidth;
        st.plot.setSize({ width: Math.max(200, st.width), height: parseInt(e.target.dataset.height, 10) || 300 });
      }
    });
  });

  function start() {
    init();
    document.querySelectorAll(".bench-curve[data-source]").forEach(function (el) { resize.observe(el); });
  }

  document.addEventListener("htmx:afterSettle", init);
  window.SwitchyardBenchmarkCurve = { init: init, palette: PALETTE.slice() };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
