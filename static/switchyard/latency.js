/* Switchyard live latency charts.
 *
 * Turns every <div class="latency-chart" data-src="URL" data-metric="latency|rate|errors|ttft|itl"
 * data-window="900"> into a live uPlot chart. Needs only uPlot (static/vendor/uplot/); no build step.
 *
 * - Polls data-src every 2 s, but only while a chart of that URL is on screen and the tab is
 *   visible. Charts sharing one URL share one poller, so a page with three charts of one
 *   deployment makes one request every 2 s, not three.
 * - data-window (seconds) sets the x range and, when data-src has no `window` parameter, is sent
 *   as `?window=`.
 * - data-height (CSS px, default 220) sets the plot height; the width follows the container.
 * - The nearest `[data-age]` (searched from the chart outwards) shows "updated N s ago" and gets
 *   class "stale" past 10 s. `table.latency-latest` elements, either with the same data-src
 *   anywhere on the page or without data-src near the chart, get the latest numbers as text.
 * - Charts added by htmx are picked up on htmx:afterSettle; removed ones are torn down.
 * - An answer with status 286 (htmx's "stop polling") is drawn and then not polled again: a
 *   finished rollout's chart (rollouts:rollout-latency) keeps what it showed.
 *
 * JSON: {"updated_at": iso|null, "age_s": s|null, "slo_p99_ms": ms, "slo_error_rate": %,
 *        "versions": {"<key>": {"label": "v1", "points": [{"t": epoch s, "rps", "error_rate" (%),
 *        "p50_ms", "p95_ms", "p99_ms", "avg_ms", "ttft_p50_ms", "ttft_p99_ms"?, "itl_p50_ms"}]}}}
 *
 * window.SwitchyardLatency exposes init(root), destroy(el), latest(data) and colourFor(key).
 */
(function () {
  "use strict";

  var REFRESH_MS = 2000;       // poll period while visible
  var STALE_S = 10;            // age beyond which [data-age] turns red
  var FETCH_TIMEOUT_MS = 8000; // give up on a request after this long
  var DEFAULT_HEIGHT = 220;

  // Okabe-Ito, the colour-blind-safe palette, minus yellow (too pale on white) and black
  // (kept for the SLO line). Versions get colours in order of first appearance on the page.
  var PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"];
  var SLO_COLOUR = "#1c2330";   // --ink
  var DASH_P50 = [6, 4];        // p50 dashed, p99 solid, SLO dash-dot
  var DASH_SLO = [12, 4, 2, 4];

  // What each data-metric draws. `lines` are per version; `optional` lines only when the data
  // has the field; `needs` names a field without which the chart shows a note instead.
  var METRICS = {
    latency: { unit: "ms", title: "p99 and p50 latency per version", lines: [
      { field: "p99_ms", name: "p99" }, { field: "p50_ms", name: "p50", dash: true }],
      slo: { key: "slo_p99_ms", label: "SLO p99" } },
    rate: { unit: "req/s", title: "requests per second per version", lines: [
      { field: "rps", name: "" }] },
    errors: { unit: "%", title: "error rate per version", lines: [
      { field: "error_rate", name: "" }],
      slo: { key: "slo_error_rate", label: "SLO errors" } },
    ttft: { unit: "ms", title: "time to first token per version", needs: "ttft_p50_ms", lines: [
      { field: "ttft_p99_ms", name: "TTFT p99", optional: true },
      { field: "ttft_p50_ms", name: "TTFT p50", dash: true }] },
    itl: { unit: "ms", title: "inter-token latency per version", needs: "itl_p50_ms", lines: [
      { field: "itl_p50_ms", name: "ITL p50" }] },
  };

  var charts = new Map();   // element → Chart
  var sources = new Map();  // url → Source
  var colours = new Map();  // version key → colour, page-wide so all charts agree

  // ---------------------------------------------------------------- helpers

  function colourFor(key) {
    if (!colours.has(key)) colours.set(key, PALETTE[colours.size % PALETTE.length]);
    return colours.get(key);
  }

  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function num(v) { return v == null || v === "" || !isFinite(v) ? null : Number(v); }

  function fmt(v, unit) {
    v = num(v);
    if (v == null) return "–";
    var digits = unit === "%" ? 2 : Math.abs(v) >= 100 ? 0 : 1;
    return v.toFixed(digits) + (unit ? (unit === "%" ? " %" : " " + unit) : "");
  }

  // Version keys in natural order ("v2" before "v10").
  function versionKeys(data) {
    return Object.keys((data && data.versions) || {}).sort(function (a, b) {
      return a.localeCompare(b, undefined, { numeric: true });
    });
  }

  function labelOf(data, key) {
    var label = data.versions[key].label || key;
    return /^\d+$/.test(label) ? "v" + label : label;
  }

  function pointsOf(data, key) {
    return (data.versions[key].points || []).slice().sort(function (a, b) { return a.t - b.t; });
  }

  function hasField(data, field) {
    return versionKeys(data).some(function (k) {
      return (data.versions[k].points || []).some(function (p) { return num(p[field]) != null; });
    });
  }

  // The latest point of each version, for tables and for anyone wiring their own display.
  function latest(data) {
    return versionKeys(data).map(function (key) {
      var pts = pointsOf(data, key);
      var row = { key: key, label: labelOf(data, key), colour: colourFor(key) };
      var last = pts[pts.length - 1] || {};
      for (var f in last) row[f] = last[f];
      return row;
    });
  }

  // ---------------------------------------------------------------- times

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // "14:05" or "14:05:09" in UTC.
  function clockUTC(t, seconds) {
    var d = new Date(t * 1000);
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + (seconds ? ":" + pad(d.getUTCSeconds()) : "");
  }

  // "11-24" in UTC.
  function dayUTC(t) {
    var d = new Date(t * 1000);
    return pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate());
  }

  // ---------------------------------------------------------------- incremental answers

  // The newest point held of any version, or null when nothing is held yet.
  function newestT(data) {
    if (!data) return null;
    var newest = null;
    versionKeys(data).forEach(function (k) {
      var pts = pointsOf(data, k);
      if (pts.length && (newest == null || pts[pts.length - 1].t > newest)) newest = pts[pts.length - 1].t;
    });
    return newest;
  }

  // An answer to a poll with ?since= holds the points from its `since` on: they replace the
  // held ones from then on (a point's slot, when it has one, is where it starts), versions it
  // leaves out keep theirs, and points older than the window are dropped. A full answer (no
  // `since`) or one from another source (router samples began or ended) replaces everything.
  function merge(held, data) {
    if (!held || data.since == null || held.source !== data.source) return data;
    var cut = data.since;
    var versions = {};
    versionKeys(held).forEach(function (k) { versions[k] = held.versions[k]; });
    versionKeys(data).forEach(function (k) {
      var kept = (versions[k] ? pointsOf({ versions: versions }, k) : []).filter(function (p) {
        return (p.slot != null ? p.slot : p.t) < cut;
      });
      versions[k] = Object.assign({}, data.versions[k], { points: kept.concat(pointsOf(data, k)) });
    });
    var newest = newestT({ versions: versions });
    var oldest = (newest == null ? 0 : newest) - (num(data.window_s) || 900);
    Object.keys(versions).forEach(function (k) {
      var pts = versions[k].points.filter(function (p) { return p.t >= oldest; });
      if (pts.length) versions[k] = Object.assign({}, versions[k], { points: pts });
      else delete versions[k];
    });
    return Object.assign({}, data, { versions: versions });
  }

  // ---------------------------------------------------------------- Source: one poller per URL

  function Source(url) {
    this.url = url;
    this.charts = new Set();
    this.data = null;
    this.fetchedAt = 0;      // performance.now() of the last good response
    this.startedAt = -Infinity;
    this.error = null;
    this.timer = null;
    this.inflight = null;
    this.final = false;      // the server answered 286: draw it, poll no more
  }

  // Poll only while the tab is visible and one of our charts is on screen.
  Source.prototype.wanted = function () {
    if (document.visibilityState !== "visible") return false;
    for (var c of this.charts) if (c.onScreen) return true;
    return false;
  };

  Source.prototype.sync = function () {
    if (!this.wanted() || this.final) {
      clearTimeout(this.timer); this.timer = null;
      if (this.inflight) { this.inflight.abort(); this.inflight = null; }
      return;
    }
    if (this.timer || this.inflight) return;
    var wait = Math.max(0, REFRESH_MS - (performance.now() - this.startedAt));
    this.timer = setTimeout(this.poll.bind(this), wait);
  };

  Source.prototype.poll = function () {
    var self = this;
    this.timer = null;
    if (!this.wanted()) return;
    var ctl = new AbortController();
    var timedOut = false;
    var guard = setTimeout(function () { timedOut = true; ctl.abort(); }, FETCH_TIMEOUT_MS);
    this.inflight = ctl;
    this.startedAt = performance.now();
    var url = this.url, newest = newestT(this.data);
    if (newest != null) {  // ask only for what is new since the newest point held
      var u = new URL(url);
      u.searchParams.set("since", String(newest));
      url = u.href;
    }
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin",
                      cache: "no-store", signal: ctl.signal })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        if (r.status === 286) self.final = true;
        return r.json();
      })
      .then(function (data) {
        self.data = merge(self.data, data);
        self.fetchedAt = performance.now();
        self.error = null;
        self.charts.forEach(function (c) { c.render(data); });
        self.tables().forEach(function (t) { fillTable(t, data); });
        tick();
      })
      .catch(function (err) {
        if (err.name === "AbortError" && !timedOut) return;  // we stopped it ourselves
        self.error = timedOut ? "timed out" : err.message || String(err);
        tick();
      })
      .finally(function () {
        clearTimeout(guard);
        if (self.inflight === ctl) { self.inflight = null; self.sync(); }
      });
  };

  Source.prototype.tables = function () {
    var found = new Set();
    this.charts.forEach(function (c) { c.tables().forEach(function (t) { found.add(t); }); });
    return found;
  };

  // Seconds since the server's newest point: its age_s plus the time since we fetched it.
  Source.prototype.age = function () {
    if (!this.data || num(this.data.age_s) == null) return null;
    return this.data.age_s + (performance.now() - this.fetchedAt) / 1000;
  };

  Source.prototype.stop = function () {
    clearTimeout(this.timer); this.timer = null;
    if (this.inflight) { this.inflight.abort(); this.inflight = null; }
  };

  // ---------------------------------------------------------------- Chart

  function Chart(el) {
    this.el = el;
    this.metric = METRICS[el.dataset.metric] ? el.dataset.metric : "latency";
    this.spec = METRICS[this.metric];
    this.windowS = parseInt(el.dataset.window, 10) || 0;
    this.height = parseInt(el.dataset.height, 10) || DEFAULT_HEIGHT;
    this.onScreen = false;
    this.plot = null;
    this.signature = null;
    this.state = { xmin: 0, xmax: 1, ytop: 1, slo: null };

    // Replace whatever was inside (a no-JS note, or a chart from an htmx history snapshot).
    el.replaceChildren();
    el.setAttribute("role", "figure");
    el.setAttribute("aria-label", "Live chart: " + this.spec.title +
      " (the latest numbers are in the legend as text)");
    this.box = document.createElement("div");
    this.note = document.createElement("p");
    this.note.className = "latency-note";
    this.note.textContent = "Waiting for data…";
    el.append(this.box, this.note);

    var url = new URL(el.dataset.src, location.href);
    if (this.windowS && !url.searchParams.has("window")) url.searchParams.set("window", this.windowS);
    this.source = sources.get(url.href) || new Source(url.href);
    sources.set(url.href, this.source);
    this.source.charts.add(this);
    if (this.source.data) this.render(this.source.data);

    this.width = el.clientWidth;
    var self = this;
    this.resizer = new ResizeObserver(function () {
      var w = el.clientWidth;
      if (w !== self.width) { self.width = w; if (self.plot) self.plot.setSize(self.size()); }
    });
    this.resizer.observe(el);
    visibility.observe(el);
  }

  Chart.prototype.size = function () {
    return { width: Math.max(120, this.el.clientWidth), height: this.height };
  };

  // The [data-age] nearest to the chart, looking outwards through its ancestors.
  Chart.prototype.ageElement = function () {
    for (var n = this.el.parentElement; n; n = n.parentElement) {
      var hit = n.querySelector("[data-age]");
      if (hit) return hit;
    }
    return null;
  };

  // Tables with our data-src anywhere, and the nearest table.latency-latest without one.
  Chart.prototype.tables = function () {
    var src = this.el.dataset.src, out = [];
    document.querySelectorAll("table.latency-latest[data-src]").forEach(function (t) {
      if (t.dataset.src === src) out.push(t);
    });
    for (var n = this.el.parentElement; n; n = n.parentElement) {
      var hit = n.querySelector("table.latency-latest:not([data-src])");
      if (hit) { out.push(hit); break; }
    }
    return out;
  };

  // Turn the JSON into uPlot's aligned columns: [x, v1 line1, v1 line2, v2 line1, ..., SLO].
  Chart.prototype.build = function (data) {
    var spec = this.spec;
    var keys = versionKeys(data);
    var lines = [], fields = [];
    keys.forEach(function (key) { colourFor(key); });   // fix colours in natural order
    if (!spec.needs || hasField(data, spec.needs)) {
      fields = spec.lines.filter(function (l) { return !l.optional || hasField(data, l.field); });
      keys.forEach(function (key) {
        fields.forEach(function (l) {
          lines.push({ key: key, field: l.field, dash: l.dash,
                       label: labelOf(data, key) + (l.name ? " " + l.name : "") });
        });
      });
    }
    var tables = keys.map(function (key) {
      var pts = pointsOf(data, key);
      var cols = [pts.map(function (p) { return p.t; })];
      fields.forEach(function (l) {
        cols.push(pts.map(function (p) { return num(p[l.field]); }));
      });
      return cols;
    });
    var aligned = lines.length ? uPlot.join(tables) : [[]];
    var x = aligned[0];

    // x range: the window, ending where the server is now (newest point + its age).
    var maxT = x.length ? x[x.length - 1] : Date.now() / 1000;
    var xmax = maxT + (num(data.age_s) || 0);
    var windowS = this.windowS || num(data.window_s) || 900;
    var xmin = xmax - windowS;

    // y range from 0 to a little above the data in view. The SLO line is kept in view unless
    // it is far above the data (then it is marked at the top instead of flattening the lines).
    var dmax = 0;
    for (var i = 1; i < aligned.length; i++) {
      for (var j = 0; j < x.length; j++) {
        var v = aligned[i][j];
        if (x[j] >= xmin && v != null && v > dmax) dmax = v;
      }
    }
    var slo = spec.slo ? num(data[spec.slo.key]) : null;
    // A spike far above the rest (over 3x the 95th percentile of the values in view) would
    // flatten every other point: the range stops above the rest and the spike is marked.
    var inView = [], peak = null;
    for (var a = 1; a < aligned.length; a++) {
      for (var k = 0; k < x.length; k++) {
        var w = aligned[a][k];
        if (x[k] >= xmin && w != null) {
          inView.push(w);
          if (peak == null || w > peak.v) peak = { t: x[k], v: w };
        }
      }
    }
    inView.sort(function (m, n) { return m - n; });
    var q95 = inView.length ? inView[Math.min(inView.length - 1, Math.floor(inView.length * 0.95))] : 0;
    var clipped = q95 > 0 && dmax > 3 * q95 ? peak : null;
    var shown = clipped ? q95 * 1.6 : dmax;
    var ytop = shown > 0 ? shown * 1.15 : 1;
    if (slo != null && slo > 0 && (shown <= 0 || slo <= shown * 3)) ytop = Math.max(ytop, slo * 1.15);
    if (clipped && clipped.v <= ytop) clipped = null;   // the SLO line made room for it

    if (slo != null && slo > 0 && !lines.length && !spec.needs) {
      // No traffic yet: the SLO line alone, across the window, so the chart says what it holds to.
      lines.push({ slo: true, label: spec.slo.label });
      return { lines: lines, data: [[xmin, xmax], [slo, slo]], xmin: xmin, xmax: xmax,
               ytop: slo * 1.5, slo: slo, clipped: null, empty: true };
    }
    if (slo != null && lines.length) {
      lines.push({ slo: true, label: spec.slo.label });
      aligned.push(x.map(function () { return slo; }));
    }
    return { lines: lines, data: aligned, xmin: xmin, xmax: xmax, ytop: ytop, slo: slo, clipped: clipped };
  };

  Chart.prototype.render = function (data) {
    var b = this.build(data);
    var st = this.state;
    st.xmin = b.xmin; st.xmax = b.xmax; st.ytop = b.ytop; st.slo = b.slo; st.clipped = b.clipped;
    this.el.dataset.ytop = String(b.ytop);
    if (b.clipped) this.el.dataset.clipped = String(b.clipped.v); else delete this.el.dataset.clipped;

    if (!b.lines.length || b.empty) {
      this.note.textContent = this.spec.needs && versionKeys(data).length
        ? "This model reports no token timings (" + this.spec.needs + "); only LLM runtimes do."
        : "No traffic in this window yet.";
      this.note.hidden = false;
      this.note.classList.toggle("over-plot", !!b.lines.length);   // a banner over the SLO line
      if (!b.lines.length) {
        if (this.plot) { this.plot.destroy(); this.plot = null; this.signature = null; }
        return;
      }
    } else {
      this.note.hidden = true;
    }

    // Same series as last time: just swap the data. Otherwise rebuild the plot.
    var sig = b.lines.map(function (l) { return l.label; }).join("|");
    if (this.plot && sig === this.signature) {
      this.plot.setData(b.data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.signature = sig;
    this.plot = new uPlot(this.options(b.lines), b.data, this.box);
  };

  Chart.prototype.options = function (lines) {
    var st = this.state, unit = this.spec.unit, slo = this.spec.slo, el = this.el;
    var px = uPlot.pxRatio || 1;
    var ink = cssVar("--ink", "#1c2330"), muted = cssVar("--muted", "#5b6472");
    var grid = cssVar("--line", "#dde1e7");
    var font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    var scaled = function (d) { return d.map(function (v) { return v * px; }); };

    // Legend values: the hovered point, or the latest value when the cursor is elsewhere.
    var value = function (u, v, si, idx) {
      if (idx == null) {
        var col = u.data[si];
        for (var i = col.length - 1; i >= 0; i--) if (col[i] != null) return fmt(col[i], unit);
        return "–";
      }
      return fmt(v, unit);
    };

    var series = [{
      label: "Time (UTC)",
      value: function (u, v, si, idx) { return idx == null ? "latest" : clockUTC(v, true); },
    }];
    lines.forEach(function (l) {
      if (l.slo) {
        series.push({ label: l.label, stroke: SLO_COLOUR, width: 1.5, dash: scaled(DASH_SLO),
                      points: { show: false }, value: value });
      } else {
        series.push({ label: l.label, stroke: colourFor(l.key), width: l.dash ? 1.5 : 2.25,
                      dash: l.dash ? scaled(DASH_P50) : undefined, value: value });
      }
    });

    var axis = { stroke: muted, font: font, labelFont: font, grid: { stroke: grid, width: 1 },
                 ticks: { stroke: grid, width: 1 } };
    return Object.assign(this.size(), {
      series: series,
      scales: {
        x: { time: true, range: function () { return [st.xmin, st.xmax]; } },
        y: { range: function () { return [0, st.ytop]; } },
      },
      axes: [
        // 24-hour times in UTC, as every time in the console; the date where the view spans
        // more than a day.
        Object.assign({}, axis, { values: function (u, splits) {
          // Minutes where they tell the ticks apart; seconds too where they would repeat.
          var days = st.xmax - st.xmin > 86400;
          var label = function (sec) {
            return splits.map(function (v) { return (days ? dayUTC(v) + " " : "") + clockUTC(v, sec); });
          };
          var out = label(false);
          if (new Set(out).size < out.length) out = label(true);
          el.dataset.xLabels = out.join(",");
          return out;
        } }),
        Object.assign({}, axis, { label: unit, labelSize: 18, size: 48,
          values: function (u, splits) { return splits.map(function (v) { return String(+v.toFixed(3)); }); } }),
      ],
      // Legend markers echo the line style: solid p99, dashed p50, dotted SLO.
      legend: { live: true, markers: { width: 3, dash: function (u, si) {
        var l = lines[si - 1];
        return !l ? "solid" : l.slo ? "dotted" : l.dash ? "dashed" : "solid";
      } } },
      cursor: { drag: { x: false, y: false } },
      hooks: { draw: [function (u) {
        drawSloLabel(u, st.slo, slo && slo.label, unit, ink);
        drawClipped(u, st.clipped, unit, ink);
      }] },
    });
  };

  Chart.prototype.destroy = function () {
    visibility.unobserve(this.el);
    this.resizer.disconnect();
    if (this.plot) this.plot.destroy();
    this.source.charts.delete(this);
    if (!this.source.charts.size) { this.source.stop(); sources.delete(this.source.url); }
    else this.source.sync();
    charts.delete(this.el);
  };

  // A text label on the SLO line ("SLO p99 50 ms"), at the left (the oldest data, so the
  // newest stays clear); if the SLO is above the chart, at the top with an arrow. On a
  // translucent white backing so that lines behind it neither hide it nor vanish.
  function drawSloLabel(u, slo, label, unit, ink) {
    if (slo == null || !label) return;
    var ctx = u.ctx, px = uPlot.pxRatio || 1, bb = u.bbox;
    var y = u.valToPos(slo, "y", true);
    var above = y < bb.top;
    var text = label + " " + fmt(slo, unit) + (above ? " ↑ above" : "");
    ctx.save();
    ctx.font = Math.round(11 * px) + "px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    var w = ctx.measureText(text).width, h = 14 * px, pad = 3 * px;
    var x = bb.left + 2 * pad;
    var top = above ? bb.top + pad : Math.max(bb.top, y - h - pad);
    ctx.fillStyle = "rgba(255,255,255,0.75)";
    ctx.fillRect(x - pad, top, w + 2 * pad, h);
    ctx.fillStyle = ink;
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(text, x, top + h / 2);
    ctx.restore();
  }

  // A spike cut off at the top of the chart: a mark where it is, with its value.
  function drawClipped(u, peak, unit, ink) {
    if (!peak) return;
    var ctx = u.ctx, px = uPlot.pxRatio || 1, bb = u.bbox;
    var x = u.valToPos(peak.t, "x", true);
    if (x < bb.left || x > bb.left + bb.width) return;
    var text = "peak " + fmt(peak.v, unit) + " (off the scale)";
    ctx.save();
    ctx.fillStyle = SLO_COLOUR;
    ctx.beginPath();
    ctx.moveTo(x, bb.top); ctx.lineTo(x - 5 * px, bb.top + 8 * px); ctx.lineTo(x + 5 * px, bb.top + 8 * px);
    ctx.closePath(); ctx.fill();
    ctx.font = Math.round(11 * px) + "px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    var w = ctx.measureText(text).width, h = 14 * px, pad = 3 * px;
    var left = Math.min(Math.max(bb.left, x - w / 2), bb.left + bb.width - w - 2 * pad);
    var top = bb.top + 24 * px;   // below the SLO line's label, which sits at the top left
    ctx.fillStyle = "rgba(255,255,255,0.8)";
    ctx.fillRect(left - pad, top, w + 2 * pad, h);
    ctx.fillStyle = ink; ctx.textAlign = "left"; ctx.textBaseline = "middle";
    ctx.fillText(text, left, top + h / 2);
    ctx.restore();
  }

  // ---------------------------------------------------------------- text outputs

  function fillTable(table, data) {
    var rows = latest(data);
    var tokens = hasField(data, "ttft_p50_ms") || hasField(data, "itl_p50_ms");
    var slo = num(data.slo_p99_ms), sloErr = num(data.slo_error_rate);
    var cols = [["rps", "req/s", "req/s"], ["error_rate", "errors", "%"], ["p50_ms", "p50", "ms"],
                ["p95_ms", "p95", "ms"], ["p99_ms", "p99", "ms"]];
    if (tokens) cols.push(["ttft_p50_ms", "TTFT p50", "ms"], ["itl_p50_ms", "ITL p50", "ms"]);

    var head = document.createElement("tr");
    var th = document.createElement("th");
    th.textContent = "Version (latest)";
    head.append(th);
    cols.forEach(function (c) {
      var h = document.createElement("th");
      h.className = "num";
      h.textContent = c[1];
      head.append(h);
    });
    var body = document.createElement("tbody");
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      var name = document.createElement("td");
      var sw = document.createElement("span");
      sw.className = "latency-swatch";
      sw.style.background = r.colour;
      name.append(sw, document.createTextNode(r.label));
      tr.append(name);
      cols.forEach(function (c) {
        var td = document.createElement("td");
        td.className = "num";
        td.textContent = fmt(r[c[0]], c[2]);
        var over = (c[0] === "p99_ms" && slo != null && num(r.p99_ms) > slo) ||
                   (c[0] === "error_rate" && sloErr != null && num(r.error_rate) > sloErr);
        if (over) { td.classList.add("over-slo"); td.textContent += " over SLO"; }
        tr.append(td);
      });
      body.append(tr);
    });
    if (!rows.length) {
      var empty = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = cols.length + 1;
      td.className = "empty";
      td.textContent = "No traffic in this window yet.";
      empty.append(td);
      body.append(empty);
    }
    var thead = document.createElement("thead");
    thead.append(head);
    table.replaceChildren(thead, body);
  }

  // Once a second: refresh "updated N s ago" texts and drop charts that left the page.
  function tick() {
    charts.forEach(function (c) { if (!c.el.isConnected) c.destroy(); });
    if (document.visibilityState !== "visible") return;
    var ages = new Map();  // [data-age] element → its freshest source
    charts.forEach(function (c) {
      var el = c.ageElement();
      if (!el) return;
      var best = ages.get(el), age = c.source.age();
      if (!best || (age != null && (best.age() == null || age < best.age()))) ages.set(el, c.source);
    });
    ages.forEach(function (src, el) {
      if (src.final) { el.textContent = "ended: no longer refreshed"; el.classList.remove("stale"); return; }
      var age = src.age(), text;
      if (age == null) text = src.data ? "no data in this window" : "waiting for data…";
      else text = "updated " + Math.max(0, Math.round(age)) + " s ago";
      if (src.error) text += " · refresh failed (" + src.error + ")";
      el.textContent = text;
      el.classList.toggle("stale", (age != null && age > STALE_S) || (!src.data && !!src.error));
    });
  }

  // ---------------------------------------------------------------- lifecycle

  var visibility = new IntersectionObserver(function (entries) {
    var touched = new Set();
    entries.forEach(function (e) {
      var c = charts.get(e.target);
      if (!c) return;
      c.onScreen = e.isIntersecting;
      touched.add(c.source);
    });
    touched.forEach(function (s) { s.sync(); });
  });

  function init(root) {
    if (!window.uPlot) { console.error("latency.js: uPlot is not loaded"); return; }
    (root || document).querySelectorAll(".latency-chart").forEach(function (el) {
      if (!charts.has(el) && el.dataset.src) charts.set(el, new Chart(el));
    });
    tick();
  }

  function destroy(el) {
    var c = charts.get(el);
    if (c) c.destroy();
  }

  // A button with data-latency-window="N" shows the last N seconds in every chart of its
  // panel ([data-latency-panel]): windows past 15 minutes come from the minute rollups.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-latency-window]");
    var panel = button && button.closest("[data-latency-panel]");
    if (!panel) return;
    panel.querySelectorAll("button[data-latency-window]").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b === button));
    });
    panel.querySelectorAll(".latency-chart").forEach(function (el) {
      destroy(el);
      el.dataset.window = button.dataset.latencyWindow;
    });
    init(panel);
  });

  document.addEventListener("visibilitychange", function () {
    sources.forEach(function (s) { s.sync(); });
    tick();
  });
  // htmx swaps: pick up new charts, tear down the ones that went.
  ["htmx:afterSettle", "htmx:historyRestore"].forEach(function (ev) {
    document.addEventListener(ev, function () { init(document); });
  });
  setInterval(tick, 1000);

  window.SwitchyardLatency = { init: init, destroy: destroy, latest: latest, colourFor: colourFor,
                               palette: PALETTE.slice() };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { init(); });
  else init();
})();
